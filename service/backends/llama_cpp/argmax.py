"""The argmax of every row of a batch's logits, split over threads when it is large.

With dozens of greedy sequences a step on a GPU, the logits llama.cpp copies
back are tens of megabytes (a row of 128k floats per sequence), and one core
scanning them took a fifth of each step on an H200 at 64 streams. numpy
releases the GIL while it scans, so row blocks on a few threads run in
parallel; the CPU's own threads are idle then, the forward pass being over.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import numpy.typing as npt

# Below this many logits one thread is quicker than handing out blocks.
_PARALLEL_FROM = 4 * 1024 * 1024
_MAX_THREADS = 8


class RowArgmax:
    def __init__(self, threads: int) -> None:
        self._threads = max(1, min(threads, _MAX_THREADS))
        self._pool: ThreadPoolExecutor | None = None

    def rows(self, logits: npt.NDArray[np.float32]) -> list[int]:
        """Index of the largest value of each row."""
        count = logits.shape[0]
        blocks = min(self._threads, count)
        if blocks < 2 or logits.size < _PARALLEL_FROM:
            return [int(token) for token in np.argmax(logits, axis=1)]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="argmax")
        bounds = np.linspace(0, count, blocks + 1).astype(int)
        parts = self._pool.map(
            lambda begin, end: np.argmax(logits[begin:end], axis=1), bounds[:-1], bounds[1:]
        )
        return [int(token) for part in parts for token in part]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None
