"""Where one request's results go from the worker thread, as the decode loop sees it.

Defined here, under the loop that writes to it, so that the loop needs nothing of
the engine: the engine's `Channel` (service.engine.worker) is one, its frame to the
front (service.engine.serve) another, and image generation uses the same shape.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol, TypeVar

T_contra = TypeVar("T_contra", contravariant=True)


class Cancellation(threading.Event):
    """The event a request's consumer sets when it stops listening, which the
    producer can also be told of at once: `when_set` listeners run on the thread
    that sets it (the scheduler stops a step nobody waits for, mid-pass)."""

    def __init__(self) -> None:
        super().__init__()
        self._listeners: list[Callable[[], None]] = []
        self._listeners_lock = threading.Lock()

    def set(self) -> None:
        with self._listeners_lock:
            super().set()
            listeners, self._listeners = self._listeners, []
        for listener in listeners:
            listener()

    def when_set(self, listener: Callable[[], None]) -> None:
        """Call `listener` once this is set: now, if it is already."""
        with self._listeners_lock:
            if not self.is_set():
                self._listeners.append(listener)
                return
        listener()


class EventSink(Protocol[T_contra]):
    """Where one request's results go from the worker thread: a `Channel` to a
    coroutine of this process, or a frame to the front (see service.engine).

    `cancelled` is set once nobody listens any more; the producer checks it
    and stops early. After `close` nothing more is sent.
    """

    @property
    def cancelled(self) -> Cancellation: ...

    def send(self, item: T_contra) -> None: ...

    def close(self, error: BaseException | None = None) -> None: ...
