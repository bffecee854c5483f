"""Work on every row of a step's logits, split over threads when they are large.

With dozens of sequences a step on a GPU, the logits llama.cpp copies back are
tens of megabytes (a row of 128k floats per sequence), and one core scanning
them took a fifth of each step on an H200 at 64 streams. numpy releases the GIL
while it scans, so row blocks on a few threads run in parallel; the CPU's own
threads are idle then, the forward pass being over. Both the greedy argmax and
the batched sampler (service.backends.batch_sampling) go through here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from service.backends.batch_sampling import (
    Row,
    best_blocks,
    candidates_in_blocks,
    candidates_needed,
    native_draws,
    sample_candidates,
)
from service.backends.native import sampler as native_sampler

# Below this many logits one thread is quicker than handing out blocks: on the H200's
# host, handing out blocks costs about half a millisecond, and 32 rows of a 128k
# vocabulary (4.1M) took 0.56-0.81 ms on one thread against 0.76-0.87 on eight
# (`python -m bench.row_search`; 1M was tried and undone, as was an argmax in C).
_PARALLEL_FROM = 4 * 1024 * 1024
_MAX_THREADS = 8

Logits = npt.NDArray[np.float32]
Result = TypeVar("Result")


class RowThreads:
    def __init__(self, threads: int) -> None:
        self._threads = max(1, min(threads, _MAX_THREADS))
        self._pool: ThreadPoolExecutor | None = None

    def argmax(self, logits: Logits) -> list[int]:
        """Index of the largest value of each row."""
        parts = self._split(logits, lambda begin, end: _argmax(logits[begin:end]))
        return [int(token) for token in np.concatenate(parts)]

    def sample(self, logits: Logits, rows: Sequence[Row]) -> list[int]:
        """One draw per row (service.backends.batch_sampling).

        In C (service/backends/native/sampler.c), each thread draws for its block of
        rows without the GIL. Without it, only numpy's search over the whole rows
        runs on the threads: the rest works on a few hundred candidates per row, and
        split over threads its many short numpy calls would wait on each other for
        the GIL (on the 16-core GPU host the whole draw on 8 threads was slower
        than on one).
        """
        if native_sampler.available():
            draws = native_draws(logits, rows)
            self._split(logits, draws.draw)
            return draws.chosen()
        width = candidates_needed([row.params for row in rows])
        blocks = self._split(logits, lambda begin, end: best_blocks(logits[begin:end], width))
        ids, values = candidates_in_blocks(logits, np.concatenate(blocks), width)
        return sample_candidates(ids, values, rows)

    def _split(self, logits: Logits, work: Callable[[int, int], Result]) -> list[Result]:
        """`work` on blocks of rows (begin, end), on the pool when it pays; each
        block's result."""
        count = logits.shape[0]
        blocks = min(self._threads, count)
        if blocks < 2 or logits.size < _PARALLEL_FROM:
            return [work(0, count)]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="rows")
        bounds = np.linspace(0, count, blocks + 1).astype(int).tolist()
        return list(self._pool.map(work, bounds[:-1], bounds[1:]))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None


def _argmax(logits: Logits) -> npt.NDArray[np.intp]:
    best: npt.NDArray[np.intp] = np.argmax(logits, axis=1)
    return best
