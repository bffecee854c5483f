"""The libraries a model can be served with, as clients and admission name them."""

from __future__ import annotations

LLAMA_CPP = "llama.cpp"
MLX_LM = "mlx-lm"
DIFFUSERS = "diffusers"
