"""A thread that owns one loaded model, and the sinks its results go out through.

Model libraries are not thread-safe and some (MLX) bind state to the thread
that created it, so a model is loaded, used and closed on its own single
thread. The event loop only moves messages:
- `call` runs one function there and awaits its result;
- `attach` gives the thread background work (the decode scheduler), advanced
  one step at a time between calls, so a request that only needs the
  tokenizer never waits for a long generation to end.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import weakref
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from typing import Any, Generic, TypeVar

import structlog

from service.decode.sink import Cancellation
from service.errors import Unavailable

T = TypeVar("T")

log = structlog.get_logger("worker")

_END = object()
_STOP = object()


class _Relay:
    """Wakes one event loop on behalf of the worker threads, from a thread of its own.

    A worker that wakes the event loop itself (call_soon_threadsafe writes to
    the loop's self-pipe) hands the GIL to the loop and then waits for the loop
    to finish before it can start the next forward pass: about half a
    millisecond per token, a quarter of a decode step on an H200. Handing items
    to this thread instead costs the worker an append; the relay takes the GIL
    when the worker releases it in the forward pass, and the loop runs while
    the model computes.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._items: queue.SimpleQueue[tuple[Channel[Any], object, BaseException | None]] = (
            queue.SimpleQueue()
        )
        threading.Thread(target=self._run, name="relay", daemon=True).start()

    def put(self, channel: Channel[Any], item: object, error: BaseException | None) -> None:
        self._items.put((channel, item, error))

    def _run(self) -> None:
        while True:
            batch = [self._items.get()]
            while not self._items.empty():
                batch.append(self._items.get_nowait())
            try:
                self._loop.call_soon_threadsafe(_hand_over, batch)
            except RuntimeError:  # the event loop is gone (shutdown): nobody listens
                for channel, _, _ in batch:
                    channel.cancelled.set()
                if self._loop.is_closed():
                    return


def _hand_over(batch: list[tuple[Channel[Any], object, BaseException | None]]) -> None:
    for channel, item, error in batch:
        channel.queue.put_nowait((item, error))


_relays: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Relay] = weakref.WeakKeyDictionary()
_relays_lock = threading.Lock()


def _relay_for(loop: asyncio.AbstractEventLoop) -> _Relay:
    with _relays_lock:
        relay = _relays.get(loop)
        if relay is None:
            relay = _relays[loop] = _Relay(loop)
        return relay


class Channel(Generic[T]):
    """Items sent from the worker thread to one consumer on the event loop.

    `cancelled` is set once the consumer stops listening (the client went
    away, its deadline passed); the producer checks it and stops early.
    `relayed` channels wake the loop through the relay thread (see `_Relay`):
    worth it when the model computes on a GPU and the CPU is free meanwhile.
    On the CPU, the loop's work would compete with llama.cpp's threads for the
    cores and slow every pass; done between passes, it costs only its time.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, relayed: bool = False) -> None:
        self._loop = loop
        self._relay = _relay_for(loop) if relayed else None
        self.queue: asyncio.Queue[tuple[object, BaseException | None]] = asyncio.Queue()
        self._cancelled = Cancellation()

    @property
    def cancelled(self) -> Cancellation:
        return self._cancelled

    def send(self, item: T) -> None:
        self._put(item, None)

    def close(self, error: BaseException | None = None) -> None:
        self._put(_END, error)

    def _put(self, item: object, error: BaseException | None) -> None:
        if self._relay is not None:
            self._relay.put(self, item, error)
            return
        try:
            self._loop.call_soon_threadsafe(self.queue.put_nowait, (item, error))
        except RuntimeError:  # the event loop is gone (shutdown): nobody listens
            self.cancelled.set()

    async def __aiter__(self) -> AsyncIterator[T]:
        try:
            while True:
                item, error = await self.queue.get()
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
        # Tasks and steps completed: read from other threads as a sign of life (an int
        # read is atomic under the GIL; a stale one is a second late, no more).
        self.progress = 0
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

    def run(self, fn: Callable[[], T]) -> T:
        """`call` for a thread without an event loop: blocks until `fn` ran there."""
        future: Future[T] = Future()

        def task() -> None:
            try:
                future.set_result(fn())
            except BaseException as exc:  # raised in the calling thread
                future.set_exception(exc)

        self.submit(task)
        return future.result()

    def shutdown(self) -> None:
        """Stop the thread once the work already sent to it has run."""
        self._closed.set()
        self._inbox.put(_STOP)

    def _run(self) -> None:
        more_background = False
        while True:
            for task in self._sent(wait=not more_background):
                if task is _STOP:
                    return
                if callable(task):
                    task()
                    self.progress += 1
            if self._background is not None:
                more_background = self._step_background(self._background)
                self.progress += 1

    def _sent(self, wait: bool) -> list[Callable[[], None] | object]:
        """Everything sent here so far, to run before the next step; with `wait`, at
        least one item. Not one per step: each request of a burst makes short calls
        (tokenizing, queueing), and one per step made the last of 64 streams wait
        about a hundred steps for its first token."""
        sent = [self._inbox.get()] if wait else []
        for _ in range(self._inbox.qsize()):  # what arrives meanwhile waits a step
            sent.append(self._inbox.get_nowait())
        return sent

    @staticmethod
    def _step_background(step: Callable[[], bool]) -> bool:
        try:
            return step()
        except Exception:  # a bug in the scheduler must not kill the model's thread
            log.exception("background step failed")
            return False
