"""The mlx-lm backend for Hugging Face-style safetensors checkpoint directories."""

from __future__ import annotations

import copy
import functools
import json
import re
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
import structlog
from mlx.nn import Module
from mlx_lm.generate import generate_step, generation_stream
from mlx_lm.models.cache import (
    ChunkedKVCache,
    ConcatenateKVCache,
    KVCache,
    QuantizedKVCache,
    can_trim_prompt_cache,
    make_prompt_cache,
    trim_prompt_cache,
)
from mlx_lm.sample_utils import LogitsProcessor, make_logits_processors, make_sampler
from mlx_lm.tokenizer_utils import (
    BPEStreamingDetokenizer,
    SPMStreamingDetokenizer,
    TokenizerWrapper,
)
from mlx_lm.utils import load

from service.backends.base import TokenStream, common_prefix_length
from service.backends.failure import load_refused
from service.backends.names import MLX_LM
from service.errors import BackendFailure
from service.text.plain_content import ControlTexts
from service.text.requests import SamplingDefaults, SamplingParams

BACKEND_NAME = MLX_LM

# generation_config.json keys where a checkpoint states its own sampling
# defaults, and the SamplingDefaults fields they fill.
_SAMPLING_KEYS = {
    "temperature": ("temperature", float),
    "top_p": ("top_p", float),
    "top_k": ("top_k", int),
    "min_p": ("min_p", float),
    "repetition_penalty": ("repeat_penalty", float),
}

# mlx-lm's default window for the repetition penalty; the cached prefix
# supplies the part of it that generate_step does not see.
_REPETITION_CONTEXT = 20

# Cache layers that can always give tokens back. Any other kind may refuse:
# a rotating sliding window once it has wrapped, a recurrent state always.
_ALWAYS_TRIMMABLE = (KVCache, QuantizedKVCache, ConcatenateKVCache, ChunkedKVCache)

# Tokens evaluated per model call when prefilling, as generate_step does.
_PREFILL_STEP = 2048

# What mlx-lm and transformers raise for a missing file, malformed JSON, an
# unknown architecture, a config that does not fit its weights, or a corrupt
# safetensors file.
_LOAD_ERRORS = (OSError, ValueError, KeyError, TypeError, RuntimeError)

# SentencePiece stores a space as "▁" and an unknown byte as a token "<0xAB>".
_SPM_SPACE = "\u2581"
_SPM_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")

_log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class MlxLmOptions:
    context_size: int


Loaded = tuple[Module, TokenizerWrapper, dict[str, Any]]


@dataclass(frozen=True)
class _Snapshot:
    """A copy of the prompt cache taken when it held exactly `ids`."""

    cache: list[Any]
    ids: list[int]


def _load(path: Path) -> Loaded:
    if not path.is_dir():
        # mlx_lm.load takes a path that does not exist for a Hub repo id and downloads it.
        raise load_refused(BACKEND_NAME, path, "it is not a directory")
    try:
        loaded = load(str(path), return_config=True)
    except _LOAD_ERRORS as exc:
        raise load_refused(BACKEND_NAME, path, str(exc)) from exc
    return cast(Loaded, loaded)  # return_config=True picks the 3-tuple of load's union


class MlxLmBackend:
    """One safetensors checkpoint loaded with mlx-lm. Not thread-safe: one worker owns it.

    The prompt cache survives between requests; `_cache_ids` are the tokens it
    holds, so the next prompt can reuse their longest common prefix. A cache
    that may not trim back to that prefix (sliding-window layers) also keeps a
    snapshot of itself after each prompt, to start the next one from.
    """

    def __init__(self, path: Path, options: MlxLmOptions) -> None:
        model, tokenizer, config = _load(path)
        self._model: Module | None = model
        self._tokenizer = tokenizer
        self._context_length = _context_length(config, options.context_size)
        self._sampling_defaults = _read_sampling_defaults(path)
        self._eos_ids = frozenset(int(token) for token in tokenizer.eos_token_ids)
        self._bos_id = _bos_id(tokenizer)
        self._adds_bos = _adds_bos(tokenizer, self._bos_id)
        self._pieces = _vocabulary_pieces(tokenizer)
        self._control_texts: ControlTexts | None = None
        self._cache: list[Any] = make_prompt_cache(model)
        self._cache_ids: list[int] = []
        self._snapshots = not all(isinstance(layer, _ALWAYS_TRIMMABLE) for layer in self._cache)
        self._snapshot: _Snapshot | None = None
        self._stream: Generator[int, None, None] | None = None

    @property
    def name(self) -> str:
        return BACKEND_NAME

    @property
    def context_length(self) -> int:
        return self._context_length

    @property
    def chat_template(self) -> str | None:
        template = self._tokenizer.chat_template
        if isinstance(template, dict):  # several named templates; the default one is for chat
            template = template.get("default")
        return template if isinstance(template, str) else None

    @property
    def template_tokens(self) -> dict[str, str]:
        return {
            "bos_token": self._tokenizer.bos_token or "",
            "eos_token": self._tokenizer.eos_token or "",
        }

    @property
    def adds_bos(self) -> bool:
        return self._adds_bos

    def is_end_of_generation(self, token_id: int) -> bool:
        return token_id in self._eos_ids

    def sampling_defaults(self) -> SamplingDefaults:
        return self._sampling_defaults

    def tokenize(self, text: str, *, add_bos: bool, special: bool = True) -> list[int]:
        # With `special`, the added tokens written in the text (a rendered chat template's
        # markers) become their ids; without, transformers splits them as plain text.
        encoded = self._tokenizer.encode(
            text, add_special_tokens=False, split_special_tokens=not special
        )
        ids = [int(token) for token in encoded]
        if add_bos and self._bos_id is not None:
            ids.insert(0, self._bos_id)
        return ids

    def control_texts(self) -> ControlTexts:
        """The added tokens marked special: with `split_special_tokens` transformers
        leaves those as text (the others it matches in text either way)."""
        if self._control_texts is None:
            added = self._tokenizer.added_tokens_decoder.values()
            self._control_texts = ControlTexts(token.content for token in added if token.special)
        return self._control_texts

    @property
    def vocab_size(self) -> int:
        return len(self._pieces)  # the tokenizer's: embedding rows past it are padding

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return str(self._tokenizer.decode(list(token_ids), skip_special_tokens=False))

    def token_bytes(self, token_id: int) -> bytes:
        if 0 <= token_id < len(self._pieces):
            return self._pieces[token_id]
        return b""  # an id of a padded embedding row, beyond the tokenizer's vocabulary

    def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> TokenStream:
        if self._stream is not None:
            # Its cache bookkeeping must finish before this request moves the cache.
            self._stream.close()
        prompt = [int(token) for token in prompt_ids]
        reused = self._reuse_cached_prefix(prompt)
        self._stream = self._sample(prompt, reused, sampling)
        return TokenStream(cached_prompt_tokens=reused, tokens=self._stream)

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        # MLX frees the arrays once nothing refers to them.
        self._model = None
        self._cache, self._cache_ids = [], []
        self._snapshot = None

    def _sample(
        self, prompt: list[int], reused: int, sampling: SamplingParams
    ) -> Generator[int, None, None]:
        mx.random.seed(sampling.seed)
        start = self._prefill(prompt, reused) if self._snapshots else reused
        steps = generate_step(
            mx.array(prompt[start:]),
            self._live_model(),
            max_tokens=-1,  # the decode loop decides when to stop, by closing this generator
            sampler=make_sampler(
                temp=sampling.temperature,
                top_p=sampling.top_p,
                min_p=sampling.min_p,
                top_k=sampling.top_k,
            ),
            logits_processors=_processors(prompt[:start], sampling),
            prompt_cache=self._cache,
        )
        self._cache_ids = []  # should generate_step fail, the cache holds an unknown prefix
        held = prompt
        try:
            for token, _ in steps:
                held.append(int(token))  # annotated as an mx.array, it is an int
                yield held[-1]
        except GeneratorExit:
            # generate_step feeds each token to the model before yielding it (it
            # samples the next one ahead), so the cache holds every token yielded.
            self._cache_ids = held
            raise
        finally:
            steps.close()

    def _reuse_cached_prefix(self, prompt: list[int]) -> int:
        """Keep the longest cached prefix of the prompt; return its length.

        At least one prompt token is always evaluated again, so that the
        logits the first sample reads belong to this prompt. When the live
        cache cannot be cut back to the shared prefix, the snapshot may serve.
        """
        common = common_prefix_length(self._cache_ids, prompt[:-1])
        if common > 0 and _trim(self._cache, len(self._cache_ids) - common):
            del self._cache_ids[common:]
            return common
        return self._restore_snapshot(prompt[:-1])

    def _restore_snapshot(self, wanted: list[int]) -> int:
        """Start from the snapshot if it holds a prefix of `wanted`, else from nothing."""
        snapshot = self._snapshot
        if snapshot is not None and wanted[: len(snapshot.ids)] == snapshot.ids:
            # A copy: the snapshot stays as it is for the requests after this one.
            self._cache, self._cache_ids = copy.deepcopy(snapshot.cache), list(snapshot.ids)
            return len(snapshot.ids)
        self._cache = make_prompt_cache(self._live_model())
        self._cache_ids = []
        return 0

    def _prefill(self, prompt: list[int], reused: int) -> int:
        """Evaluate the prompt up to its last token, snapshot the cache; return that length.

        generate_step evaluates the last token itself, for the logits the first
        sample reads; a snapshot taken after it would hold a token the next
        prompt may not share.
        """
        end = len(prompt) - 1
        self._cache_ids = []  # should the model fail midway, the cache holds an unknown prefix
        model = self._live_model()
        with mx.stream(generation_stream):
            for start in range(reused, end, _PREFILL_STEP):
                chunk = mx.array(prompt[start : min(start + _PREFILL_STEP, end)])
                model(chunk[None], cache=self._cache)
                mx.eval([layer.state for layer in self._cache])
                mx.clear_cache()  # as generate_step does: give back the chunk's freed buffers
        self._cache_ids = prompt[:end]
        self._keep_snapshot()
        return end

    def _keep_snapshot(self) -> None:
        held = self._cache_ids
        if not held or (self._snapshot is not None and self._snapshot.ids == held):
            return  # nothing to keep, or kept already
        self._snapshot = _Snapshot(copy.deepcopy(self._cache), list(held))

    def _live_model(self) -> Module:
        if self._model is None:
            raise BackendFailure("this mlx-lm model was closed")
        return self._model


def _trim(cache: list[Any], count: int) -> bool:
    """Take `count` tokens off the end of the cache; whether that was possible."""
    if count == 0:
        return True  # even a cache that cannot be trimmed (a recurrent state) can grow
    if not can_trim_prompt_cache(cache):
        return False
    trimmed: Any = trim_prompt_cache(cache, count)  # annotated as a list, it is the count
    return bool(trimmed == count)


def _processors(cached: Sequence[int], sampling: SamplingParams) -> list[LogitsProcessor] | None:
    """The logit bias first (as llama.cpp's chain has it), then the penalties."""
    processors = _penalties(cached, sampling) or []
    if sampling.logit_bias:
        processors = make_logits_processors(logit_bias=dict(sampling.logit_bias)) + processors
    return processors or None


def _penalties(cached: Sequence[int], sampling: SamplingParams) -> list[LogitsProcessor] | None:
    if not sampling.penalized:
        return None
    processors = make_logits_processors(
        repetition_penalty=sampling.repeat_penalty if sampling.repeat_penalty != 1.0 else None,
        repetition_context_size=_REPETITION_CONTEXT,
        presence_penalty=sampling.presence_penalty,
        presence_context_size=_REPETITION_CONTEXT,
        frequency_penalty=sampling.frequency_penalty,
        frequency_context_size=_REPETITION_CONTEXT,
    )
    history = cached[-_REPETITION_CONTEXT:]
    if not history:
        return processors
    # generate_step only knows the tokens it was given, not those reused from the cache.
    earlier = mx.array(list(history))
    return [_with_history(processor, earlier) for processor in processors]


def _with_history(processor: LogitsProcessor, earlier: mx.array) -> LogitsProcessor:
    def process(tokens: mx.array, logits: mx.array) -> mx.array:
        return processor(mx.concatenate([earlier, tokens]), logits)

    return process


def _context_length(config: dict[str, Any], requested: int) -> int:
    text_config = config.get("text_config")
    nested = text_config if isinstance(text_config, dict) else {}
    trained = config.get("max_position_embeddings", nested.get("max_position_embeddings"))
    if isinstance(trained, int) and 0 < trained < requested:
        return trained  # a window beyond the trained one gives garbage
    return requested


def _read_sampling_defaults(path: Path) -> SamplingDefaults:
    stated = _read_generation_config(path / "generation_config.json")
    found: dict[str, Any] = {}
    for key, (field_name, convert) in _SAMPLING_KEYS.items():
        value = stated.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            found[field_name] = convert(value)
    return SamplingDefaults(**found)


def _read_generation_config(file: Path) -> dict[str, Any]:
    if not file.is_file():
        return {}
    try:
        stated = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        # mlx-lm itself loads such a checkpoint, ignoring the file; so do we, loudly.
        _log.warning("ignoring an unreadable generation config", file=str(file), error=str(exc))
        return {}
    return stated if isinstance(stated, dict) else {}


def _bos_id(tokenizer: TokenizerWrapper) -> int | None:
    bos = tokenizer.bos_token_id
    return bos if isinstance(bos, int) else None


def _adds_bos(tokenizer: TokenizerWrapper, bos_id: int | None) -> bool:
    if bos_id is None:
        return False
    # The tokenizer's own post-processor says whether this model wants one.
    probe = tokenizer.encode("a", add_special_tokens=True)
    return bool(probe[:1] == [bos_id])


def _vocabulary_pieces(tokenizer: TokenizerWrapper) -> list[bytes]:
    """The UTF-8 bytes each token id contributes to the text, b"" for special tokens."""
    ids = list(range(len(tokenizer)))
    tokens: list[str | None] = tokenizer.convert_ids_to_tokens(ids)
    piece = _piece_rule(tokenizer)
    not_text = set(tokenizer.all_special_ids)
    literal: dict[int, bytes] = {}
    for token_id, added in tokenizer.added_tokens_decoder.items():
        if added.special:
            not_text.add(token_id)
        else:  # added tokens are stored as plain text, never byte-level encoded
            literal[token_id] = added.content.encode("utf-8")
    return [
        b"" if token is None or token_id in not_text else literal.get(token_id) or piece(token)
        for token_id, token in zip(ids, tokens, strict=True)
    ]


def _piece_rule(tokenizer: TokenizerWrapper) -> Callable[[str], bytes]:
    """How a token string maps to bytes, as mlx-lm's loader read tokenizer.json's decoder."""
    detokenizer = tokenizer.detokenizer
    if isinstance(detokenizer, BPEStreamingDetokenizer):
        return _byte_level_piece
    if isinstance(detokenizer, SPMStreamingDetokenizer):
        return _sentencepiece_piece
    # Another decoder: rely on it for each token alone (it may drop a leading space).
    return lambda token: str(tokenizer.convert_tokens_to_string([token])).encode("utf-8")


def _byte_level_piece(token: str) -> bytes:
    table = _byte_level_table()
    return b"".join(
        bytes([table[char]]) if char in table else char.encode("utf-8") for char in token
    )


def _sentencepiece_piece(token: str) -> bytes:
    byte = _SPM_BYTE.fullmatch(token)
    if byte is not None:
        return bytes([int(byte.group(1), 16)])
    return token.replace(_SPM_SPACE, " ").encode("utf-8")


@functools.cache
def _byte_level_table() -> dict[str, int]:
    """GPT-2's bytes_to_unicode, inverted: the character each byte is stored as.

    Printable Latin-1 bytes stand for themselves; the others (controls, space)
    are shifted to characters from U+0100 on, in byte order.
    """
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    shifted = [byte for byte in range(256) if byte not in printable]
    table = {chr(byte): byte for byte in printable}
    table.update({chr(256 + index): byte for index, byte in enumerate(shifted)})
    return table
