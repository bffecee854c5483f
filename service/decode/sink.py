"""Where one request's results go from the worker thread, as the decode loop sees it.

Defined here, under the loop that writes to it, so that the loop needs nothing of
the engine: the engine's `Channel` (service.engine.worker) is one, its frame to the
front (service.engine.serve) another, and image generation uses the same shape.
"""

from __future__ import annotations

import threading
from typing import Protocol, TypeVar

T_contra = TypeVar("T_contra", contravariant=True)


class EventSink(Protocol[T_contra]):
    """Where one request's results go from the worker thread: a `Channel` to a
    coroutine of this process, or a frame to the front (see service.engine).

    `cancelled` is set once nobody listens any more; the producer checks it
    and stops early. After `close` nothing more is sent.
    """

    @property
    def cancelled(self) -> threading.Event: ...

    def send(self, item: T_contra) -> None: ...

    def close(self, error: BaseException | None = None) -> None: ...
