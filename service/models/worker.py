"""A thread that owns one loaded model.

Model libraries are not thread-safe and some (MLX) bind state to the thread
that created it, so a model is loaded, used and closed on its own single
thread. The event loop only moves messages: `call` runs one function there,
`stream` runs a generator there and hands its items to the event loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

_END = object()


class ModelWorker:
    def __init__(self, name: str) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"model:{name}")

    async def call(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    def stream(self, produce: Callable[[threading.Event], Iterator[T]]) -> AsyncIterator[T]:
        """Iterate `produce(cancelled)` on the worker thread.

        When the consumer stops early (the client went away, its deadline
        passed), `cancelled` is set; the producer checks it between items and
        returns, which frees the model for the next request.
        """

        def run(emit: Callable[[T], None], cancelled: threading.Event) -> None:
            for item in produce(cancelled):
                emit(item)
                if cancelled.is_set():
                    return

        return self.run_emitting(run)

    async def run_emitting(
        self, work: Callable[[Callable[[T], None], threading.Event], None]
    ) -> AsyncIterator[T]:
        """Run `work(emit, cancelled)` on the worker thread; yield what it emits.

        For libraries that report through callbacks (a diffusion step callback)
        rather than by yielding. `cancelled` is set when the consumer stops early.
        """
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[object, BaseException | None]] = asyncio.Queue()
        cancelled = threading.Event()

        def send(item: object, error: BaseException | None = None) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, (item, error))
            except RuntimeError:  # the event loop is gone (shutdown): nobody listens
                cancelled.set()

        def run() -> None:
            try:
                work(send, cancelled)
            except BaseException as exc:  # handed to the consumer, raised there
                send(_END, exc)
            else:
                send(_END)

        loop.run_in_executor(self._executor, run)
        try:
            while True:
                item, error = await queue.get()
                if error is not None:
                    raise error
                if item is _END:
                    return
                yield item  # type: ignore[misc]
        finally:
            cancelled.set()

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
