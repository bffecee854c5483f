"""The hub's network work on threads of its own, bounded in number and in time.

Admit on a hub model reads the hub's metadata on a thread. On asyncio's
default executor (a handful of threads on a small machine) forty Admits
waiting on a hub that never answered held every thread, and the load of a
local model, which needs those threads too, waited a minute. So hub calls run
here: a few threads, a bounded number of calls waiting for them (past it
RESOURCE_EXHAUSTED at once), and a deadline after which the caller hears
UNAVAILABLE. A call past its deadline keeps its thread until the library's
own timeouts end it; it counts against the bound until then, so a hung hub
can fill this pool, and nothing else.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import ParamSpec, TypeVar

from service.errors import Overloaded, Unavailable

P = ParamSpec("P")
T = TypeVar("T")


class HubWork:
    def __init__(self, threads: int = 8, max_waiting: int = 64, timeout: float = 30.0) -> None:
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="hub")
        self._capacity = threads + max_waiting
        self._timeout = timeout
        self._lock = threading.Lock()
        self.pending = 0  # calls submitted whose thread has not finished

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`fn(*args, **kwargs)` on a hub thread, within the deadline."""
        with self._lock:
            if self.pending >= self._capacity:
                raise Overloaded(
                    f"{self.pending} calls to the Hugging Face hub are under way or waiting, "
                    "this server's limit; retry later"
                )
            self.pending += 1
        context = contextvars.copy_context()
        future: Future[T] = self._executor.submit(
            context.run, functools.partial(fn, *args, **kwargs)
        )
        future.add_done_callback(self._finished)
        try:
            async with asyncio.timeout(self._timeout):  # wait_for can lose a cancel (3.11)
                return await asyncio.wrap_future(future)
        except TimeoutError:
            raise Unavailable(
                f"the Hugging Face hub did not answer within {self._timeout:g} s; retry later"
            ) from None

    def _finished(self, _: Future[T]) -> None:
        with self._lock:
            self.pending -= 1

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
