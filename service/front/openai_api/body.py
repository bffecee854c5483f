"""Request bodies read within their budgets and parsed off the event loop.

The HTTP port shares its event loop with the gRPC port, so nothing a body holds may
keep that loop busy. A body is refused before it is parsed when it is too large
(its `Content-Length`, or the bytes counted as they come, chunked bodies too), too
slow to arrive, or holds more JSON items or containers than any request needs
(`json_budget`); the bounds make the parse cheap. What remains (json.loads, the walks
for depth, nulls and lone surrogates, the translation to the contract's messages) runs
on a worker thread: a Python walk there gives the loop the interpreter every few
milliseconds, and the only calls that hold it longer (json.loads, bytes.count) are
bounded by the budget.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

from aiohttp import web

from service.errors import InvalidRequest, TimedOut, Unavailable
from service.front.offload import Offload

P = ParamSpec("P")
T = TypeVar("T")


class BodyTooLarge(InvalidRequest):
    """Answered with 413, as OpenAI's API does; INVALID_ARGUMENT in the metrics."""


class BodyTooSlow(TimedOut):
    """Answered with 408 and the connection closed; DEADLINE_EXCEEDED in the metrics."""


class BodiesBuffered(Unavailable):
    """The bodies being read hold the server's whole body memory: 503, retry soon
    (here or, behind a proxy, elsewhere)."""


@dataclass(frozen=True)
class BodyLimits:
    """`--http-max-body-bytes`, `--http-body-seconds`, `--http-body-memory-bytes`."""

    max_bytes: int = 16 << 20
    seconds: float = 30.0
    memory_bytes: int = 256 << 20


class BodyReader:
    """Reads bodies within `BodyLimits` and runs their parse and translation on the
    server's request-work threads (`Offload`: two, so what the parses hold in memory
    at once is bounded too)."""

    def __init__(self, limits: BodyLimits, offload: Offload) -> None:
        self.limits = limits
        self._buffered = 0
        self._offload = offload

    async def read(self, request: web.Request) -> bytes:
        """The whole body, or BodyTooLarge, BodyTooSlow or BodiesBuffered."""
        limits = self.limits
        declared = request.content_length
        if declared is not None and declared > limits.max_bytes:
            raise _too_large(limits.max_bytes)
        chunks: list[bytes] = []
        taken = 0
        try:
            async with asyncio.timeout(limits.seconds):
                async for chunk in request.content.iter_any():
                    if taken + len(chunk) > limits.max_bytes:
                        raise _too_large(limits.max_bytes)
                    self._take(len(chunk))
                    taken += len(chunk)
                    chunks.append(chunk)
        except TimeoutError:
            raise BodyTooSlow(
                f"the request body did not all arrive within {limits.seconds:g} s "
                "(--http-body-seconds)"
            ) from None
        finally:
            self._buffered -= taken
        return b"".join(chunks)

    def _take(self, size: int) -> None:
        if self._buffered + size > self.limits.memory_bytes:
            raise BodiesBuffered(
                f"the server is reading {self._buffered >> 20} MiB of request bodies, all "
                f"its --http-body-memory-bytes ({self.limits.memory_bytes >> 20} MiB); "
                "retry in a moment"
            )
        self._buffered += size

    async def off_loop(self, work: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`work(*args)` on a request-work thread, the loop free meanwhile."""
        return await self._offload.run(work, *args, **kwargs)


def _too_large(limit: int) -> BodyTooLarge:
    return BodyTooLarge(f"the request body is larger than {limit} bytes (--http-max-body-bytes)")
