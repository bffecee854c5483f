"""How much memory loaded models may use, and how much a model needs on the host and the GPU."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_BUDGET_FRACTION = 0.8


def available_memory_bytes() -> int:
    """Memory the kernel says is available now (MemAvailable), else all of it."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def default_budget_bytes() -> int:
    return int(available_memory_bytes() * DEFAULT_BUDGET_FRACTION)


def format_bytes(count: int) -> str:
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def cells_per_sequence(context_size: int) -> int:
    """The KV cells llama.cpp gives each sequence of a per-sequence cache: the
    context rounded up to a multiple of 256."""
    return -(-context_size // 256) * 256


@dataclass(frozen=True)
class MemoryNeed:
    """What a model takes once loaded, and how much of it sits in GPU memory.

    The pool budgets `host_bytes` against the memory budget and `device_bytes`
    against the GPU memory budget.
    """

    weights_bytes: int = 0
    kv_cache_bytes: int = 0
    device_bytes: int = 0
    # Host memory for finished conversations parked out of the KV cache.
    parked_bytes: int = 0
    # The library's working memory for one step where it is reserved whole: llama.cpp's
    # compute buffer on a GPU (on the CPU its pages are touched only as a step needs).
    compute_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_cache_bytes + self.compute_bytes + self.parked_bytes

    @property
    def host_bytes(self) -> int:
        return self.total_bytes - self.device_bytes

    @classmethod
    def offloaded(cls, weights: int, kv_cache: int, share: float, compute: int = 0) -> MemoryNeed:
        """Weights and KV cache with `share` of both on the GPU (see `offloaded_share`),
        and a compute buffer in GPU memory."""
        device = round((weights + kv_cache) * share) + compute
        return cls(weights, kv_cache, device_bytes=device, compute_bytes=compute)


def offloaded_share(gpu_layers: int, layer_count: int) -> float:
    """The share of a model llama.cpp puts on the GPU when asked for `gpu_layers` layers.

    An estimate by layer count: llama.cpp offloads the last `gpu_layers` repeating
    layers with their KV cache (any negative count, or one past the model's, means
    all of them). It keeps the token embeddings on the host and moves the output
    layer only with all layers; those are not counted apart here.
    """
    if layer_count <= 0 or gpu_layers == 0:
        return 0.0
    if gpu_layers < 0 or gpu_layers >= layer_count:
        return 1.0
    return gpu_layers / layer_count
