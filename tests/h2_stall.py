"""A hostile HTTP/2 client: it opens gRPC streams and never lets the server send a byte.

It speaks raw HTTP/2 with the `h2` package: its SETTINGS give every stream an
initial receive window of 0, and it never sends WINDOW_UPDATE, so each of
the server's DATA frames waits forever; it answers the server's pings (h2
acknowledges them), so the connection looks alive. This is how one
connection pinned every slot of the server (issue 27).
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from types import TracebackType

import h2.config
import h2.connection
import h2.events
import h2.settings
from google.protobuf.message import Message


class StalledStreams:
    """One TCP connection holding `count` streams the server cannot write to."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self._socket = socket.create_connection((host, int(port)))
        self._h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self._h2.initiate_connection()
        self._h2.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
        self._lock = threading.Lock()
        self.ended: dict[int, str] = {}  # stream id -> how it ended (grpc-status, reset)
        self.answered: set[int] = set()  # streams whose response headers came
        self.data_bytes = 0
        self._flush()
        self._running = True
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def open(self, method: str, request: Message) -> int:
        """Start an RPC (`/package.Service/Method`) and send its one request message."""
        body = request.SerializeToString()
        with self._lock:
            stream = self._h2.get_next_available_stream_id()
            self._h2.send_headers(
                stream,
                [
                    (":method", "POST"),
                    (":scheme", "http"),
                    (":path", method),
                    (":authority", "localhost"),
                    ("content-type", "application/grpc"),
                    ("te", "trailers"),
                ],
            )
            self._h2.send_data(stream, struct.pack(">BI", 0, len(body)) + body, end_stream=True)
        self._flush()
        return stream

    def close(self) -> None:
        self._running = False
        with contextlib.suppress(OSError):
            self._socket.shutdown(socket.SHUT_RDWR)
        self._socket.close()

    def __enter__(self) -> StalledStreams:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _flush(self) -> None:
        with self._lock:
            data = self._h2.data_to_send()
        if data:
            self._socket.sendall(data)

    def _read(self) -> None:
        while self._running:
            try:
                data = self._socket.recv(65536)
            except OSError:
                return
            if not data:
                return
            with self._lock:
                events = self._h2.receive_data(data)
            for event in events:
                self._note(event)
            self._flush()  # ping acknowledgements, settings acknowledgements

    def _note(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.DataReceived):
            self.data_bytes += len(event.data)  # never acknowledged: the window stays shut
        elif isinstance(event, h2.events.TrailersReceived):
            self.ended[event.stream_id] = _status(event.headers) or "grpc-status ?"
        elif isinstance(event, h2.events.ResponseReceived):
            self.answered.add(event.stream_id)
            status = _status(event.headers)
            if status is not None:  # a trailers-only response
                self.ended[event.stream_id] = status
        elif isinstance(event, h2.events.StreamReset):
            self.ended[event.stream_id] = f"reset {event.error_code}"


def _status(headers: object) -> str | None:
    for name, value in headers or []:  # type: ignore[attr-defined]
        if bytes(name) == b"grpc-status":
            return f"grpc-status {bytes(value).decode()}"
    return None
