"""A hostile HTTP/1.1 client on a raw socket: it reads its answer slowly or never, and
sends its request's body slowly or never.

An HTTP library reads what the server sends as it comes; here the test decides.
The socket's kernel buffers are kept small (a small SO_RCVBUF and, where the
platform has it, a small TCP_MAXSEG, which keeps the server's send buffer small
too: Linux sizes it from the segment size), so a server that writes to a client
that does not read is stopped after tens of kilobytes, not megabytes. This is
how SSE readers held their requests open over HTTP (issue 38).
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from types import TracebackType
from typing import Any

RECEIVE_BUFFER_BYTES = 1024
SEGMENT_BYTES = 256


class SlowClient:
    """One connection to 127.0.0.1:`port`, one request on it."""

    def __init__(self, port: int) -> None:
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER_BYTES)
        with contextlib.suppress(OSError, AttributeError):
            self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, SEGMENT_BYTES)
        self._socket.connect(("127.0.0.1", port))
        self._closed = threading.Event()
        self._threads: list[threading.Thread] = []
        self.received = bytearray()
        self.ended = ""  # how the server ended the connection: "eof" or "reset"

    def post(self, path: str, body: dict[str, Any]) -> None:
        """The whole request at once."""
        data = json.dumps(body).encode()
        self._socket.sendall(_headers(path, len(data)) + data)

    def post_slowly(self, path: str, body: dict[str, Any], seconds_per_byte: float) -> None:
        """The headers at once, then the body one byte at a time (seconds_per_byte 0:
        never), until the server closes the connection."""
        data = json.dumps(body).encode()
        self._socket.sendall(_headers(path, len(data)))
        if seconds_per_byte:
            self._start(self._trickle, data, seconds_per_byte)

    def read_slowly(self, seconds_per_byte: float) -> None:
        """Read one byte at a time, until the connection ends."""
        self._start(self._read, seconds_per_byte)

    def read_to_end(self, timeout: float = 60) -> bytes:
        """Everything until the server ends the connection; fails on a timeout."""
        self._socket.settimeout(timeout)
        self._read(0)
        assert self.ended, "the connection did not end"
        return bytes(self.received)

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._socket.shutdown(socket.SHUT_RDWR)
        self._socket.close()
        for thread in self._threads:
            thread.join(timeout=10)

    def __enter__(self) -> SlowClient:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _start(self, target: Any, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _trickle(self, data: bytes, seconds_per_byte: float) -> None:
        for byte in data:
            if self._closed.wait(seconds_per_byte):
                return
            try:
                self._socket.send(bytes([byte]))
            except OSError:
                return

    def _read(self, seconds_per_byte: float) -> None:
        while not self._closed.is_set():
            try:
                data = self._socket.recv(1 if seconds_per_byte else 65536)
            except ConnectionResetError:
                self.ended = "reset"
                return
            except OSError:
                return
            if not data:
                self.ended = "eof"
                return
            self.received += data
            if seconds_per_byte:
                time.sleep(seconds_per_byte)


def _headers(path: str, length: int) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()
