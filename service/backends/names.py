"""The libraries a model can be served with, as clients and admission name them, and the
vocabularies of their options."""

from __future__ import annotations

from typing import Literal

LLAMA_CPP = "llama.cpp"
MLX_LM = "mlx-lm"
DIFFUSERS = "diffusers"
# A configured model's backend setting: images come from the external command.
EXTERNAL = "external"

# llama.cpp: flash attention on the GPU, and how the KV cache holds sequences.
FlashAttention = Literal["auto", "on", "off"]
KvLayout = Literal["auto", "unified", "per-sequence"]
# What a model's cache is once "auto" has been settled by where the model computes.
KvCacheLayout = Literal["unified", "per-sequence"]


def kv_layout_on(layout: KvLayout, on_gpu: bool) -> KvCacheLayout:
    """The cache layout a model gets; "auto" is a cache per sequence on a GPU and one
    shared pool on the CPU.

    On a GPU, a cache per sequence keeps each token's attention to its own cells
    (a shared pool's spans every sequence's, masked), which is worth a third more
    tokens/s at 128 streams and a twentieth of the TTFT tail under long mixed prompts
    (docs/gpu.md). Each sequence then holds --context-size cells, so the memory is
    that many times the pool's: on the CPU, where memory is the tighter budget,
    the pool stays the default.
    """
    if layout == "auto":
        return "per-sequence" if on_gpu else "unified"
    return layout
