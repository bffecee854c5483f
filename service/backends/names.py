"""The libraries a model can be served with, as clients and admission name them, and the
vocabularies of their options."""

from __future__ import annotations

from typing import Literal

LLAMA_CPP = "llama.cpp"
# An embedding model (BERT and kin), loaded in llama.cpp's embedding mode.
LLAMA_CPP_EMBEDDINGS = "llama.cpp-embeddings"
MLX_LM = "mlx-lm"
DIFFUSERS = "diffusers"
# A configured model's backend setting: images come from the external command.
EXTERNAL = "external"

# llama.cpp: flash attention on the GPU, and how the KV cache holds sequences.
FlashAttention = Literal["auto", "on", "off"]
KvLayout = Literal["auto", "unified", "per-sequence"]
# What a model's cache is once "auto" has been settled by where the model computes.
KvCacheLayout = Literal["unified", "per-sequence"]
# llama.cpp: whether a step's draws run inside its graph (service/backends/llama_cpp/
# graph_sampling.py) or on the host from copied logits.
SampleInGraph = Literal["auto", "on", "off"]


# llama.cpp's step size (n_batch and n_ubatch) when the operator sets none. Under long
# prompts arriving while dozens of streams decode, a GPU step of 512 tokens leaves
# prompts about 450 beside the streams, too few to keep up: prompts queue, and TTFT
# and every stream's step grow together. With 1,024 the same traffic was read in as it
# came (H200, docs/benchmarks.md). On a CPU a step of either size costs its tokens'
# time, and 512 keeps the compute buffer (its logits rows) half the size.
GPU_BATCH_SIZE = 1024
CPU_BATCH_SIZE = 512


def batch_size_on(batch_size: int | None, on_gpu: bool) -> int:
    """The most tokens one llama.cpp step evaluates: the configured size, else by where
    the model computes."""
    if batch_size is not None:
        return batch_size
    return GPU_BATCH_SIZE if on_gpu else CPU_BATCH_SIZE


def sample_in_graph_on(setting: SampleInGraph, on_gpu: bool) -> bool:
    """Whether a model's draws run inside llama.cpp's graph: "auto" is on a GPU, where
    copying every row's logits back and scanning them is what stands between a step and
    the next (docs/gpu.md); off on the CPU, where the graph's argmax and top-k run on
    the same cores as the host's draw would and measured 7% slower (docs/gpu.md,
    "Sampling in the graph")."""
    if setting == "auto":
        return on_gpu
    return setting == "on"


def top_candidates_in_graph(setting: SampleInGraph) -> bool:
    """Whether sampled rows with a top-k take their candidates from the graph (rows
    without one are drawn whole there whenever the graph samples): only when asked
    for. On an H200 the graph's top-k over a 128k vocabulary made sampled decoding
    8-28% slower than the host's draw at 1 to 128 streams (docs/gpu.md)."""
    return setting == "on"


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
