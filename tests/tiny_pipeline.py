"""A tiny real Stable Diffusion pipeline directory for the diffusers backend's tests.

Built from diffusers' and transformers' own classes with the sizes diffusers'
own StableDiffusionPipeline tests use, random weights, and a CLIP tokenizer
read from a vocab.json and merges.txt written here, so nothing is downloaded.
`save_pretrained` lays it out exactly as a user's pipeline directory.

The diffusers classes are imported from their own modules: through diffusers'
top level, mypy sees the placeholders that stand in when torch is missing.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any, Literal

import torch
from diffusers.models.autoencoders.autoencoder_kl import AutoencoderKL
from diffusers.models.unets.unet_2d_condition import UNet2DConditionModel
from diffusers.pipelines.stable_diffusion.pipeline_stable_diffusion import StableDiffusionPipeline
from diffusers.schedulers.scheduling_ddim import DDIMScheduler
from diffusers.schedulers.scheduling_pndm import PNDMScheduler
from tokenizers import pre_tokenizers
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

START_OF_TEXT, END_OF_TEXT = "<|startoftext|>", "<|endoftext|>"
# CLIP's tokenizer marks the last piece of each word with this suffix.
END_OF_WORD = "</w>"
MAX_TOKENS = 77  # CLIP's context; the pipeline pads every prompt to it

# A few merges, so that the tokenizer does more than split into bytes. Each
# merge's parts are in the vocabulary already, or made by an earlier merge.
_MERGES = [
    ("r", "e"),
    ("re", "d</w>"),
    ("a", "p"),
    ("p", "l"),
    ("pl", "e</w>"),
    ("ap", "ple</w>"),
    ("o", "n</w>"),
    ("t", "a"),
    ("l", "e</w>"),
    ("b", "le</w>"),
    ("ta", "ble</w>"),
    ("t", "h"),
    ("th", "e</w>"),
    ("a", "n"),
    ("an", "d</w>"),
]


def build_tiny_sd_pipeline(directory: Path, *, scheduler: Literal["ddim", "pndm"] = "ddim") -> Path:
    """Save a tiny StableDiffusionPipeline (64x64 images by default) in `directory`.

    DDIM runs as many steps as asked, as in diffusers' tests; PNDM, which
    Stable Diffusion 1.x ships with, runs one more.
    """
    with tempfile.TemporaryDirectory() as scratch:
        tokenizer = _read_tokenizer(_write_tokenizer_files(Path(scratch)))
    # A dict of components, as diffusers' tests pass them: its annotations call the
    # scheduler an enum and leave out None for the parts a pipeline can do without.
    components: dict[str, Any] = {
        "vae": _vae(),
        "text_encoder": _text_encoder(tokenizer),
        "tokenizer": tokenizer,
        "unet": _unet(),
        "scheduler": _pndm_scheduler() if scheduler == "pndm" else _ddim_scheduler(),
        "safety_checker": None,
        "feature_extractor": None,
        "requires_safety_checker": False,
    }
    pipeline = StableDiffusionPipeline(**components)
    pipeline.save_pretrained(directory, safe_serialization=True)
    return directory


def _vocabulary() -> tuple[dict[str, int], list[str]]:
    """Every byte as a token alone and at a word's end, the merges, then the specials."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokens = alphabet + [char + END_OF_WORD for char in alphabet]
    tokens += [left + right for left, right in _MERGES]
    tokens += [START_OF_TEXT, END_OF_TEXT]
    merges = [f"{left} {right}" for left, right in _MERGES]
    return {token: index for index, token in enumerate(tokens)}, merges


def _write_tokenizer_files(directory: Path) -> Path:
    """The two files a CLIP tokenizer was published as before tokenizer.json."""
    vocab, merges = _vocabulary()
    (directory / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (directory / "merges.txt").write_text(
        "#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8"
    )
    return directory


def _read_tokenizer(directory: Path) -> CLIPTokenizer:
    tokenizer: CLIPTokenizer = CLIPTokenizer.from_pretrained(
        directory, model_max_length=MAX_TOKENS, local_files_only=True
    )
    return tokenizer


def _unet() -> UNet2DConditionModel:
    torch.manual_seed(0)
    unet: UNet2DConditionModel = UNet2DConditionModel(
        block_out_channels=(32, 64),
        layers_per_block=2,
        sample_size=32,
        in_channels=4,
        out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32,
    )
    return unet


def _vae() -> AutoencoderKL:
    torch.manual_seed(0)
    vae: AutoencoderKL = AutoencoderKL(
        block_out_channels=(32, 64),
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        latent_channels=4,
    )
    return vae


def _text_encoder(tokenizer: CLIPTokenizer) -> CLIPTextModel:
    torch.manual_seed(0)
    config = CLIPTextConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        hidden_size=32,
        intermediate_size=37,
        layer_norm_eps=1e-05,
        num_attention_heads=4,
        num_hidden_layers=5,
        vocab_size=len(tokenizer),
        max_position_embeddings=MAX_TOKENS,
    )
    return CLIPTextModel(config)


def _ddim_scheduler() -> DDIMScheduler:
    scheduler: DDIMScheduler = DDIMScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        clip_sample=False,
        set_alpha_to_one=False,
        steps_offset=1,  # as Stable Diffusion 1.x ships it; diffusers warns about 0
    )
    return scheduler


def _pndm_scheduler() -> PNDMScheduler:
    scheduler: PNDMScheduler = PNDMScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        set_alpha_to_one=False,
        skip_prk_steps=True,  # as Stable Diffusion 1.x ships it; diffusers warns without
        steps_offset=1,
    )
    return scheduler
