"""Refusing a model that keeps crashing its engine.

A broken model file can kill its engine on every load. Without a limit the
server would restart it for every request, burning CPU and memory and filling
the log. After `limit` crashes within `window_s` seconds the model is refused,
with a message that says why, until when, and what a person can do.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime


class CrashHistory:
    """Recent crashes per model. Used from the event loop only, so no lock.

    `limit <= 0` turns the backoff off: nothing is kept and nothing refused.
    """

    def __init__(
        self, limit: int = 3, window_s: float = 600.0, clock: Callable[[], float] = time.time
    ) -> None:
        self._limit = limit
        self._window_s = window_s
        self._clock = clock
        # (time, cause) per model, oldest first; only the last `limit` matter.
        self._crashes: dict[str, deque[tuple[float, str]]] = {}

    def record(self, model: str, cause: str) -> None:
        if self._limit <= 0:
            return
        history = self._crashes.setdefault(model, deque(maxlen=self._limit))
        history.append((self._clock(), cause))

    def crashes(self, model: str) -> int:
        """How many crashes of `model` are within the window (at most `limit`)."""
        return len(self._recent(model, self._clock()))

    def refusal(self, model: str) -> str | None:
        """None while `model` may be started, else why it may not and until when."""
        now = self._clock()
        recent = self._recent(model, now)
        if self._limit <= 0 or len(recent) < self._limit:
            return None
        # Refused until the oldest of the last `limit` crashes leaves the window.
        until = recent[0][0] + self._window_s
        return self._message(model, recent[-1][1], until, now)

    def _recent(self, model: str, now: float) -> deque[tuple[float, str]]:
        history = self._crashes.get(model)
        if history is None:
            return deque()
        while history and history[0][0] <= now - self._window_s:
            history.popleft()
        if not history:
            del self._crashes[model]  # models that recovered cost no memory
        return history

    def _message(self, model: str, last_cause: str, until: float, now: float) -> str:
        at = datetime.fromtimestamp(until, tz=UTC).strftime("%H:%M:%S")
        wait_s = max(1, math.ceil(until - now))
        return (
            f"model {model!r} crashed {self._limit} times in the last "
            f"{_duration(self._window_s)} (last: {last_cause}); it is refused until "
            f"{at} UTC, in {wait_s} s, so that a broken file cannot make the server "
            "restart it over and over. Check the model file, or restart the server "
            "to try at once."
        )


def _duration(seconds: float) -> str:
    """ "10 minutes" when it is a whole number of minutes, else "90 seconds"."""
    if seconds > 0 and seconds % 60 == 0:
        minutes = int(seconds // 60)
        return "minute" if minutes == 1 else f"{minutes} minutes"
    return f"{seconds:g} seconds"
