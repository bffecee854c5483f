"""A tiny real Hugging Face-style checkpoint for the mlx-lm backend's tests.

Built with mlx-lm's own model classes and save utilities and a byte-level BPE
tokenizer trained here, so the backend reads exactly what a user's checkpoint
holds, with nothing downloaded. mlx-lm and transformers are imported by the functions
that use them (seconds): importing this module for its constants costs nothing.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_map
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

IM_START, IM_END, END_OF_TEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
BEGIN_OF_TEXT = "<|begin_of_text|>"
MAX_POSITION_EMBEDDINGS = 512
# Short, so a test's prompt wraps the rotating cache of gemma3_text's sliding layer.
SLIDING_WINDOW = 8

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Enough English for a few hundred merges; café, naïve and ☃ stay byte tokens.
_TRAINING_TEXT = """\
The quick brown fox jumps over the lazy dog. A model reads a prompt and writes
a completion, one token at a time, until it reaches the end of its turn or the
number of tokens it was allowed. The cache keeps the keys and values of the
tokens it has seen, so a second request that starts with the same words does
not need to read them again. Once upon a time there was a small language model
that lived on a computer with only two cores. It could not say much, but it
said it quickly, and the tests that ran it were happy with what they heard.
What is the capital of France? The capital of France is Paris. What is two
plus two? Two plus two is four. The three primary colors are red, yellow and
blue. Please answer the question in a short sentence.
"""


def _train_tokenizer(special_tokens: list[str]) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([_TRAINING_TEXT] * 4, trainer=trainer)
    return tokenizer


def _add_bos_processor(tokenizer: Tokenizer) -> None:
    """Prepend the BOS token when asked for special tokens, as Llama 3 does."""
    bos_id = tokenizer.token_to_id(BEGIN_OF_TEXT)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BEGIN_OF_TEXT} $A",
        pair=f"{BEGIN_OF_TEXT} $A {BEGIN_OF_TEXT} $B",
        special_tokens=[(BEGIN_OF_TEXT, bos_id)],
    )


def _save_tokenizer(directory: Path, with_bos: bool) -> PreTrainedTokenizerFast:
    from transformers import PreTrainedTokenizerFast

    special = [END_OF_TEXT, IM_START, IM_END] + ([BEGIN_OF_TEXT] if with_bos else [])
    trained = _train_tokenizer(special)
    if with_bos:
        _add_bos_processor(trained)
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=trained,
        bos_token=BEGIN_OF_TEXT if with_bos else None,
        eos_token=IM_END,
        pad_token=END_OF_TEXT,
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    tokenizer.save_pretrained(directory)
    return tokenizer


def _llama(vocab_size: int) -> tuple[nn.Module, dict[str, Any]]:
    from mlx_lm.models import llama

    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=48,
        num_hidden_layers=2,
        intermediate_size=96,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        vocab_size=vocab_size,
        max_position_embeddings=MAX_POSITION_EMBEDDINGS,
        tie_word_embeddings=False,
    )
    return llama.Model(args), {**asdict(args), "architectures": ["LlamaForCausalLM"]}


def _gemma3_text(vocab_size: int) -> tuple[nn.Module, dict[str, Any]]:
    """Gemma 3's layout: a rotating cache of SLIDING_WINDOW tokens, then a global layer."""
    from mlx_lm.models import gemma3_text

    args = gemma3_text.ModelArgs(
        model_type="gemma3_text",
        hidden_size=48,
        num_hidden_layers=2,
        intermediate_size=96,
        num_attention_heads=4,
        head_dim=16,
        num_key_value_heads=2,
        query_pre_attn_scalar=16,
        sliding_window=SLIDING_WINDOW,
        sliding_window_pattern=2,
        vocab_size=vocab_size,
        max_position_embeddings=MAX_POSITION_EMBEDDINGS,
    )
    return gemma3_text.Model(args), {**asdict(args), "architectures": ["Gemma3ForCausalLM"]}


_ARCHITECTURES = {"llama": _llama, "gemma3_text": _gemma3_text}


def _save_model(directory: Path, architecture: str, vocab_size: int, eos_token_id: int) -> None:
    from mlx_lm.utils import save_config, save_model

    mx.random.seed(1234)  # the weights, hence every greedy completion, are fixed
    model, config = _ARCHITECTURES[architecture](vocab_size)
    # At their initial scale the weights make a model that repeats its last
    # token whatever came before; larger ones make the whole context count,
    # so a prompt cache holding the wrong tokens changes what it writes.
    model.update(
        tree_map(lambda weight: weight * 3 if weight.ndim == 2 else weight, model.parameters())
    )
    mx.eval(model.parameters())
    save_model(directory, model)
    save_config({**config, "eos_token_id": eos_token_id}, config_path=directory / "config.json")


def build_tiny_checkpoint(
    directory: Path,
    *,
    with_bos: bool = False,
    architecture: str = "llama",
    generation_config: dict[str, Any] | None = None,
) -> Path:
    """Write a tiny checkpoint into `directory` and return it.

    By default it is Qwen-like: no BOS token, ChatML with `<|im_end|>` as eos.
    `with_bos` makes it Llama 3-like, prepending `<|begin_of_text|>`.
    `architecture` is "llama" or "gemma3_text" (sliding-window layers).
    """
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = _save_tokenizer(directory, with_bos)
    eos_token_id = tokenizer.convert_tokens_to_ids(IM_END)
    assert isinstance(eos_token_id, int)
    _save_model(directory, architecture, len(tokenizer), eos_token_id)
    if generation_config is not None:
        (directory / "generation_config.json").write_text(json.dumps(generation_config))
    return directory
