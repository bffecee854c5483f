"""The HTTP port's connections, bounded so that no client can starve the process.

aiohttp keeps any connection it is given for as long as the client likes. Here every
connection the listening socket accepts passes through a `ConnectionGuard`:

- at most `max_connections` are open (fewer when the process's file-descriptor
  limit leaves less than that above `--fd-reserve`, so the gRPC port, the engines
  and the model files always have descriptors), and at most `max_per_peer` from
  one address;
- at a cap, the longest-idle connection (one with no request in progress: never
  sent one, sending its headers, or waiting between requests) of that peer, or of
  anyone, is closed to make room; when every connection is busy the new one is
  answered 503 and closed;
- a connection's request head (request line and headers) may hold at most
  `max_head_bytes` (431 past it), so the memory of connections that send headers
  and hold their body back is bounded by the cap times this;
- idle connections close after `idle_seconds` (aiohttp's keep-alive timeout, which
  it also counts from the connection's start while the first request's headers come).

A draining server closes its idle connections at once, cuts those still sending a
body, and gives requests in progress the grace period (`OpenAiHttp.drain`).

It relies on two of aiohttp's internals, both checked by tests/test_http_connections.py:
the handler's queue of parsed requests (`_messages`), which says when a request's
head has arrived, and the protocol object asyncio sees being ours, not aiohttp's.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections import OrderedDict
from dataclasses import dataclass

import structlog
from aiohttp import web
from aiohttp.web_protocol import RequestHandler

log = structlog.get_logger("http")


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int = 1024
    max_per_peer: int = 256
    max_head_bytes: int = 64 << 10
    idle_seconds: float = 10.0


class GuardedConnection(asyncio.Protocol):
    """aiohttp's handler of one connection, behind the guard: asyncio calls this,
    which passes every event on."""

    def __init__(self, guard: ConnectionGuard, handler: RequestHandler) -> None:
        self._guard = guard
        self.handler = handler
        self.transport: asyncio.Transport | None = None
        self.peer = ""
        self.busy = False  # a request's head arrived and its response is not all sent
        self.reading_body = False
        self._head_bytes = 0
        self._admitted = False
        self._head_refused = False
        self._tail = b""  # the last bytes of the head so far, for an end split between reads

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        refusal = self._guard.admit(self)
        if refusal is not None:
            _refuse(transport, 503, refusal)
            return
        self._admitted = True
        self.handler.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if not self._admitted or self._head_refused:
            return
        if not self.busy and self._head_too_long(data):
            self._head_refused = True  # aiohttp hears of it as the connection's end
            assert self.transport is not None
            limit = self._guard.limits.max_head_bytes
            message = f"the request line and headers are over {limit} bytes (--http-max-head-bytes)"
            _refuse(self.transport, 431, message)
            return
        self.handler.data_received(data)
        if not self.busy and self.handler._messages:  # a request's head arrived
            self.busy = True
            self._guard.touch(self)

    def _head_too_long(self, data: bytes) -> bool:
        """Count the head's bytes up to the blank line that ends it (its body and what
        follows are not head), before aiohttp's parser holds any of them."""
        seen = self._tail + data
        end = seen.find(b"\r\n\r\n")
        self._head_bytes += len(data) if end < 0 else max(0, end + 4 - len(self._tail))
        self._tail = seen[-3:] if end < 0 else b""
        return self._head_bytes > self._guard.limits.max_head_bytes

    def request_done(self, body_read: bool) -> None:
        """Its response is all sent: idle again, its next head counted from nothing. A
        body left unread (a request refused before it) is aiohttp's to drain: what comes
        next is that body, not a head, so the connection stays busy until its next
        request is done."""
        self.reading_body = False
        if not body_read:
            self._guard.touch(self)
            return
        self.busy = False
        self._head_bytes = 0
        self._tail = b""
        self._guard.touch(self)

    def eof_received(self) -> None:
        if self._admitted:
            self.handler.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._guard.release(self)
        if self._admitted:
            self._admitted = False
            self.handler.connection_lost(exc)

    def pause_writing(self) -> None:
        self.handler.pause_writing()

    def resume_writing(self) -> None:
        self.handler.resume_writing()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()


class ConnectionGuard:
    """The open connections, oldest-idle first, by peer too."""

    def __init__(self, limits: ConnectionLimits, fd_cap: int | None = None) -> None:
        self.limits = limits
        self.max_connections = min(limits.max_connections, fd_cap or limits.max_connections)
        self._open: OrderedDict[GuardedConnection, None] = OrderedDict()
        self._by_peer: dict[str, int] = {}
        self.refused = 0
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._open)

    def admit(self, connection: GuardedConnection) -> str | None:
        """Make room for `connection` and count it, or say why it is refused."""
        if self._by_peer.get(connection.peer, 0) >= self.limits.max_per_peer and not (
            self._evict(connection.peer)
        ):
            self.refused += 1
            return (
                f"{self.limits.max_per_peer} connections from this address are open and "
                "busy (--http-max-connections-per-peer)"
            )
        if len(self._open) >= self.max_connections and not self._evict(None):
            self.refused += 1
            return (
                f"{self.max_connections} connections are open and busy "
                "(--http-max-connections, or the file-descriptor limit less --fd-reserve)"
            )
        self._open[connection] = None
        self._by_peer[connection.peer] = self._by_peer.get(connection.peer, 0) + 1
        return None

    def touch(self, connection: GuardedConnection) -> None:
        """It changed state: the most recently active now."""
        if connection in self._open:
            self._open.move_to_end(connection)

    def release(self, connection: GuardedConnection) -> None:
        if connection not in self._open:
            return
        del self._open[connection]
        left = self._by_peer[connection.peer] - 1
        if left:
            self._by_peer[connection.peer] = left
        else:
            del self._by_peer[connection.peer]

    def _evict(self, peer: str | None) -> bool:
        """Close the longest-idle connection (of `peer`, if given); False if none is idle."""
        idle = next(
            (c for c in self._open if not c.busy and (peer is None or c.peer == peer)), None
        )
        if idle is None:
            return False
        self.release(idle)
        idle.abort()
        self.evicted += 1
        return True

    def close_idle(self) -> int:
        """Close every idle connection and cut every request still sending its body;
        how many went. Requests in progress are left to the grace period."""
        going = [c for c in self._open if not c.busy or c.reading_body]
        for connection in going:
            connection.abort()
        return len(going)

    def abort_all(self) -> None:
        for connection in list(self._open):
            connection.abort()


def connection_of(request: web.BaseRequest) -> GuardedConnection | None:
    """The guarded connection a request came on (None outside a guarded site)."""
    transport = request.transport
    protocol = transport.get_protocol() if transport is not None else None
    return protocol if isinstance(protocol, GuardedConnection) else None


def _refuse(transport: asyncio.Transport, status: int, message: str) -> None:
    """Answer an HTTP error in OpenAI's shape and close, without aiohttp."""
    reason = {431: "Request Header Fields Too Large", 503: "Service Unavailable"}[status]
    body = json.dumps(
        {"error": {"message": message, "type": "server_error", "param": None, "code": None}}
    ).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n"
        + ("Retry-After: 1\r\n" if status == 503 else "")
        + "\r\n"
    )
    transport.write(head.encode() + body)
    transport.close()


class GuardedSite(web.BaseSite):
    """A TCP site whose connections pass through `guard`."""

    def __init__(
        self,
        runner: web.BaseRunner,
        guard: ConnectionGuard,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        super().__init__(runner, ssl_context=ssl_context)
        self._guard = guard
        self._host = host
        self._port = port

    @property
    def name(self) -> str:
        scheme = "https" if self._ssl_context else "http"
        return f"{scheme}://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        guard = self._guard

        def guarded() -> GuardedConnection:
            return GuardedConnection(guard, server())

        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            guarded, self._host, self._port, ssl=self._ssl_context, backlog=self._backlog
        )
