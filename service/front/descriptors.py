"""File descriptors: the process's limit raised as far as it may go, a reserve kept
for what is not an HTTP connection, and the accept errors at the limit logged
without flooding the log.

At the limit, every accept() fails with EMFILE; asyncio logs each failure with its
traceback and retries a second later, and gRPC's own accept fails the same way. The
HTTP port is the one a client can fill, so its connection cap leaves `reserve`
descriptors free: the gRPC port, the engines' pipes, model files and the logs keep
theirs, and the accept errors should not come at all.
"""

from __future__ import annotations

import asyncio
import resource
import time
from typing import Any

import structlog

log = structlog.get_logger("descriptors")

# asyncio's message for a failed accept (selector_events._accept_connection).
_ACCEPT_FAILED = "socket.accept() out of system resource"


def raise_descriptor_limit() -> int:
    """The soft RLIMIT_NOFILE raised to the hard one (as Go's runtime does); the soft
    limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft


def http_connection_cap(reserve: int) -> int:
    """How many HTTP connections leave `reserve` descriptors of the limit free (at
    least 16, said in the log if the limit is that tight)."""
    soft = raise_descriptor_limit()
    cap = soft - reserve
    if cap < 16:
        log.warning(
            "the file-descriptor limit leaves almost nothing for HTTP connections",
            limit=soft,
            reserve=reserve,
        )
        return 16
    return cap


class AcceptErrorLog:
    """A loop exception handler that logs failed accepts once per `interval` with how
    many there were, and no traceback; everything else goes to the previous handler."""

    def __init__(self, loop: asyncio.AbstractEventLoop, interval: float = 60.0) -> None:
        self._loop = loop
        self._interval = interval
        self._previous = loop.get_exception_handler()
        self._count = 0
        self._last = -interval
        loop.set_exception_handler(self)

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if context.get("message") != _ACCEPT_FAILED:
            if self._previous is not None:
                self._previous(loop, context)
            else:
                loop.default_exception_handler(context)
            return
        self._count += 1
        now = time.monotonic()
        if now - self._last >= self._interval:
            log.error(
                "accept failed: out of file descriptors or memory; new connections wait",
                error=str(context.get("exception")),
                failures=self._count,
                interval_seconds=self._interval,
            )
            self._count = 0
            self._last = now

    def close(self) -> None:
        if self._loop.get_exception_handler() is self:
            self._loop.set_exception_handler(self._previous)
