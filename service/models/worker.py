"""A thread that owns one loaded model.

Model libraries are not thread-safe and some (MLX) bind state to the thread
that created it, so a model is loaded, used and closed on its own single
thread. The event loop only moves messages:
- `call` runs one function there and awaits its result;
- `run_emitting` runs a function that reports through a callback (a
  diffusion step) and hands what it reports to the event loop;
- `attach` gives the thread background work (the decode scheduler), advanced
  one step at a time between calls, so a request that only needs the
  tokenizer never waits for a long generation to end.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from typing import Generic, TypeVar

import structlog

from service.errors import Unavailable

T = TypeVar("T")

log = structlog.get_logger("worker")

_END = object()
_STOP = object()


class Channel(Generic[T]):
    """Items sent from the worker thread to one consumer on the event loop.

    `cancelled` is set once the consumer stops listening (the client went
    away, its deadline passed); the producer checks it and stops early.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue: asyncio.Queue[tuple[object, BaseException | None]] = asyncio.Queue()
        self.cancelled = threading.Event()

    def send(self, item: T) -> None:
        self._put(item, None)

    def close(self, error: BaseException | None = None) -> None:
        self._put(_END, error)

    def _put(self, item: object, error: BaseException | None) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, (item, error))
        except RuntimeError:  # the event loop is gone (shutdown): nobody listens
            self.cancelled.set()

    async def __aiter__(self) -> AsyncIterator[T]:
        try:
            while True:
                item, error = await self._queue.get()
                if error is not None:
                    raise error
                if item is _END:
                    return
                yield item  # type: ignore[misc]
        finally:
            self.cancelled.set()


class ModelWorker:
    def __init__(self, name: str) -> None:
        self._inbox: queue.SimpleQueue[Callable[[], None] | object] = queue.SimpleQueue()
        self._background: Callable[[], bool] | None = None
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"model:{name}", daemon=True)
        self._thread.start()

    def attach(self, step: Callable[[], bool]) -> None:
        """Background work: `step()` advances it once and says whether more remains."""
        self._background = step

    def submit(self, task: Callable[[], None]) -> None:
        """Run `task` on the worker thread, in order with everything else sent there."""
        if self._closed.is_set():
            raise Unavailable("this model is being unloaded; retry")
        self._inbox.put(task)

    async def call(self, fn: Callable[[], T]) -> T:
        future: Future[T] = Future()

        def task() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn())
            except BaseException as exc:  # handed to the awaiting coroutine
                future.set_exception(exc)

        self.submit(task)
        return await asyncio.wrap_future(future)

    async def run_emitting(
        self, work: Callable[[Callable[[T], None], threading.Event], None]
    ) -> AsyncIterator[T]:
        """Run `work(emit, cancelled)` on the worker thread; yield what it emits.

        For libraries that report through callbacks (a diffusion step callback)
        rather than by yielding. `cancelled` is set when the consumer stops early.
        """
        channel: Channel[T] = Channel(asyncio.get_running_loop())

        def task() -> None:
            try:
                work(channel.send, channel.cancelled)
            except BaseException as exc:  # handed to the consumer, raised there
                channel.close(exc)
            else:
                channel.close()

        self.submit(task)
        async for item in channel:
            yield item

    def shutdown(self) -> None:
        """Stop the thread once the work already sent to it has run."""
        self._closed.set()
        self._inbox.put(_STOP)

    def _run(self) -> None:
        more_background = False
        while True:
            try:
                task = self._inbox.get(block=not more_background)
            except queue.Empty:
                task = None
            if task is _STOP:
                return
            if callable(task):
                task()
            if self._background is not None:
                more_background = self._step_background(self._background)

    @staticmethod
    def _step_background(step: Callable[[], bool]) -> bool:
        try:
            return step()
        except Exception:  # a bug in the scheduler must not kill the model's thread
            log.exception("background step failed")
            return False
