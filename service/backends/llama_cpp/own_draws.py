"""Draws of sequences with a sampler of their own, run beside the step.

Most rows of a step are drawn together (service.backends.batch_sampling). A
row with a grammar, or with settings only a llama.cpp chain handles, is drawn
on its own, and that can take milliseconds: a grammar ruling on the whole
vocabulary, a chain sorting it. Every other stream of the model would wait for
it each step. So such a row's logits are copied and its draw runs on a thread
here, while the model's thread draws the other rows. The step then waits for it
only as long as its own share of the step (the forward pass's time over the
rows in it); a draw still running after that is collected by a later step, and
its sequence sits out the forward passes in between.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Generic, TypeVar

from service.backends.base import Sampled

Key = TypeVar("Key")

# Draws running at once: each is one sequence's sampler, which only one thread uses.
_THREADS = 4


class OwnDraws(Generic[Key]):
    """Draws in flight, one at most per sequence (`Key`); used by the model's thread."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._running: dict[Key, Future[Sampled]] = {}

    def running(self, sequence: Key) -> bool:
        return sequence in self._running

    def start(self, sequence: Key, draw: Callable[[], Sampled]) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(_THREADS, thread_name_prefix="own-draws")
        self._running[sequence] = self._pool.submit(draw)

    def wait(self, sequences: Iterable[Key], seconds: float) -> None:
        """Until these sequences' draws are done, or `seconds` have passed."""
        futures = [self._running[s] for s in sequences if s in self._running]
        if futures:
            wait(futures, timeout=max(seconds, 0.0))

    def wait_for_any(self, sequences: Iterable[Key]) -> None:
        """Until one of these sequences' draws is done (when nothing else can go on)."""
        futures = [self._running[s] for s in sequences if s in self._running]
        if futures:
            wait(futures, return_when=FIRST_COMPLETED)

    def collect(self, sequences: Iterable[Key]) -> dict[Key, Sampled]:
        """These sequences' draws that are done, each once. A draw that raised raises
        here."""
        running = self._running
        done = {s: running[s] for s in sequences if s in running and running[s].done()}
        for sequence in done:
            del self._running[sequence]
        return {sequence: future.result() for sequence, future in done.items()}

    def settle(self, sequence: Key) -> None:
        """Wait for this sequence's draw and drop it: the sequence is going away, and
        its sampler must not be freed while the draw still uses it."""
        future = self._running.pop(sequence, None)
        if future is not None:
            wait([future])

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self._running.clear()
