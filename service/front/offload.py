"""CPU-heavy request work (decoding a large request, compiling a grammar) off the event loop.

The event loop must only move messages: a request that takes it a few
seconds to convert stalls every other stream of the server for that long. Such
work runs on a small thread pool of its own, so a flood of expensive requests
queues behind itself, not behind (or in front of) the pool's model loads and
admissions, which use asyncio's default executor.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


# Enough to keep a second request's conversion from waiting behind a long one;
# more would only contend for the GIL with the event loop.
THREADS = 2


class Offload:
    def __init__(self, threads: int = THREADS) -> None:
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="request-work")

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`fn(*args, **kwargs)` on the pool; log lines keep the request's context."""
        context = contextvars.copy_context()
        call = functools.partial(context.run, fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
