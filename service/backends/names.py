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
KvLayout = Literal["unified", "per-sequence"]
