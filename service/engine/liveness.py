"""Whether an engine that has work is still alive and getting somewhere.

An engine sends a heartbeat every second from a thread of its own, carrying
its worker's progress (tasks and background steps done: a decode step, one
embedding batch). The front judges:

- nothing at all from the engine for `hang_seconds` while requests wait on
  it: the process is frozen (stopped, swapped out, wedged in the kernel);
- heartbeats, but no progress for `stall_seconds` while requests wait: the
  worker is stuck in one call (a native loop that never returns).

Either way the engine is killed and handled like a crashed one: its streams
end with UNAVAILABLE naming the cause, the pool drops the model, and the next
request starts a fresh engine. Before, a SIGSTOPped engine's streams got no
token and no error, and requests without a deadline queued behind them until
every other model starved.

So a model's work must come in steps much shorter than `stall_seconds`: an Embed
request of 2,048 long inputs was one call of minutes, and killed as stuck; it
is now one batch a step (service.engine.embedding_queue), and bounded as a whole
by the request token budget.

A third case is no fault of the engine: an image whose request was cancelled
(its client left, its deadline passed) and that is still being computed
`cancel_seconds` after the cancel was sent. The pipeline checks for a cancel
as each layer starts, but one layer of a large image on a CPU (an attention
over 65,536 positions) runs for minutes, and nothing else can interrupt it.
The engine is killed and its model discarded, not counted as a crash: the
next request starts a fresh engine (an image engine serves one image at a
time, so only the images queued behind the abandoned one are lost with it).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Liveness:
    hang_seconds: float = 30.0
    stall_seconds: float = 300.0
    cancel_seconds: float = 5.0


@dataclass
class Pulse:
    """What the front has heard from one engine, on its clock (time.monotonic)."""

    heard_at: float
    progress: int = 0
    progressed_at: float = 0.0

    def heard(self, now: float, progress: int | None = None) -> None:
        self.heard_at = now
        if progress is not None and progress != self.progress:
            self.progress = progress
            self.progressed_at = now

    def verdict(self, now: float, busy: bool, limits: Liveness) -> str | None:
        """Why the engine counts as hung, or None. Only an engine with work is judged:
        an idle one has nothing to be late with."""
        if not busy:
            self.progressed_at = now  # the clock for progress starts with the work
            return None
        silent = now - self.heard_at
        if silent > limits.hang_seconds:
            return f"it sent nothing for {silent:.0f} s while serving (frozen or stopped)"
        still = now - self.progressed_at
        if still > limits.stall_seconds:
            return f"its model made no progress for {still:.0f} s while serving (stuck)"
        return None


def overdue(cancelled_at: Iterable[float], now: float, limits: Liveness) -> float | None:
    """How long the oldest cancelled request has gone on since its cancel was sent (times
    from time.monotonic), once that is past `cancel_seconds`; None while all are within."""
    late = now - min(cancelled_at, default=now)
    return late if late > limits.cancel_seconds else None
