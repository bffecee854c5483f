"""Request bodies read within their budgets and parsed off the event loop.

The HTTP port shares its event loop with the gRPC port, so nothing a body holds may
keep that loop busy. A body is refused before it is parsed when it is too large
(its `Content-Length`, or the bytes counted as they come, chunked bodies too), too
slow to arrive, or holds more JSON items or containers than any request needs; the
bounds make the parse cheap. What remains (json.loads, the walks for depth, nulls and
lone surrogates, the translation to the contract's messages) runs on a worker thread:
a Python walk there gives the loop the interpreter every few milliseconds, and the
only calls that hold it longer (json.loads, bytes.count) are bounded by the budget.

The counts are an upper bound read from the raw bytes at C speed: every item of an
array or member of an object but the first follows a comma, and every container
opens with a bracket. Text inside strings counts too, so a body of prose or code with
more than a million commas is refused: that is several megabytes of text, past any
context this server runs.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

from aiohttp import web

from service.errors import InvalidRequest, TimedOut, Unavailable
from service.front.offload import Offload

P = ParamSpec("P")
T = TypeVar("T")

# Items (array elements and object members, every level) and containers (objects
# and arrays) one body may hold. A million token ids, or 2,048 embedding inputs of
# 8,192 ids each, as OpenAI's limits have them, fit; the memory of the parsed body
# stays below about 150 MB (docs/operations.md, "Request bodies").
MAX_ITEMS = 1 << 20
MAX_CONTAINERS = 1 << 18
# A `\uD800`-`\uDFFF` escape: the only way a lone surrogate enters (raw UTF-8 cannot
# hold one, and json.loads refuses it). Pairs are fine: the walk checks each string.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")


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


def check_json_budget(raw: bytes) -> None:
    """Refuse, before parsing, a body with more items or containers than MAX_ITEMS and
    MAX_CONTAINERS: an upper bound counted on the raw bytes (the module says how)."""
    containers = raw.count(b"{") + raw.count(b"[")
    if containers > MAX_CONTAINERS:
        raise InvalidRequest(
            f"the request body holds more than {MAX_CONTAINERS} JSON objects and arrays "
            "(brackets counted, those in strings too); send less in one request"
        )
    items = raw.count(b",") + containers + 1
    if items > MAX_ITEMS:
        raise InvalidRequest(
            f"the request body holds more than {MAX_ITEMS} JSON items (commas counted, "
            "those in strings too); send less in one request"
        )


def refuse_lone_surrogates(raw: bytes, body: object) -> None:
    """InvalidRequest naming the first string of `body` that holds a lone UTF-16
    surrogate (`"\\ud800"` unpaired), which no model, tokenizer or protobuf can take.
    The walk runs only when the raw body has a surrogate escape at all."""
    if _SURROGATE_ESCAPE.search(raw) is None:
        return
    pending: list[tuple[str, object]] = [("", body)]
    while pending:
        where, value = pending.pop()
        if isinstance(value, str):
            _check_text(value, where)
        elif isinstance(value, dict):
            for key, child in value.items():
                _check_text(key, where or "the body")
                pending.append((f"{where}.{key}" if where else key, child))
        elif isinstance(value, list):
            pending.extend((f"{where}[{index}]", child) for index, child in enumerate(value))


def _check_text(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start]
        raise InvalidRequest(
            f"`{where}` holds a lone UTF-16 surrogate (\\u{ord(bad):04x}) at character "
            f"{exc.start}; strings must be valid Unicode (a surrogate only in a pair)",
            param=where.split(".")[0].split("[")[0] or None,
        ) from None
