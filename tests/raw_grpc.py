"""One gRPC call over raw HTTP/2 (the `h2` package), to see what a proxy sends on
the wire: the trailers' grpc-status, or a stream reset and its error code. A gRPC
library hides the difference (it reads a reset as INTERNAL) and enforces a
deadline itself; this client sends `grpc-timeout` and waits for the other end."""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events
from google.protobuf.message import Message


@dataclass
class Ending:
    """How the stream ended: trailers (their grpc-status) or a reset (its code)."""

    grpc_status: str | None = None
    reset_code: int | None = None
    data: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


def call(
    target: str,
    method: str,
    request: Message,
    timeout_ms: int | None = None,
    content_type: str = "application/grpc",
    wait: float = 60,
) -> Ending:
    """`method` (`/package.Service/Method`) with one request message, over h2c with
    prior knowledge (`content_type` application/grpc-web+proto: grpc-web over HTTP/2);
    the socket gives up after `wait` seconds of silence (a bound against a hang)."""
    host, port = target.rsplit(":", 1)
    connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    with socket.create_connection((host, int(port)), timeout=wait) as sock:
        connection.initiate_connection()
        stream = connection.get_next_available_stream_id()
        headers = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", method),
            (":authority", target),
            ("content-type", content_type),
            ("te", "trailers"),
        ]
        if timeout_ms is not None:
            headers.append(("grpc-timeout", f"{timeout_ms}m"))
        connection.send_headers(stream, headers)
        body = request.SerializeToString()
        connection.send_data(stream, struct.pack(">BI", 0, len(body)) + body, end_stream=True)
        sock.sendall(connection.data_to_send())
        return _read(sock, connection, stream)


def _read(sock: socket.socket, connection: h2.connection.H2Connection, stream: int) -> Ending:
    ending = Ending()
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return ending  # the connection closed: neither trailers nor a reset
        for event in connection.receive_data(chunk):
            if getattr(event, "stream_id", stream) != stream:
                continue
            if isinstance(event, h2.events.DataReceived):
                ending.data += event.data
                connection.acknowledge_received_data(event.flow_controlled_length, stream)
            elif isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
                for name, value in event.headers:
                    ending.headers[_text(name)] = _text(value)
                ending.grpc_status = ending.headers.get("grpc-status", ending.grpc_status)
            elif isinstance(event, h2.events.StreamReset):
                ending.reset_code = int(event.error_code)
                return ending
            if isinstance(event, h2.events.StreamEnded):
                return ending
        sock.sendall(connection.data_to_send())


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
