"""Frames on the socket between the front and an engine: a 4-byte big-endian
length, then that many bytes of one protobuf message.

The engine side is blocking (a socket read by its main thread, written by its
worker thread under a lock); the front side is asyncio streams.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from collections.abc import Iterator
from typing import TypeVar

from google.protobuf.message import Message

M = TypeVar("M", bound=Message)

_HEADER = struct.Struct(">I")
# A frame longer than this is not one we sent: the stream is corrupt.
MAX_FRAME_BYTES = 1 << 30


class FrameError(Exception):
    """The other side sent something that is not a frame of ours."""


def encode(message: Message) -> bytes:
    payload = message.SerializeToString()
    return _HEADER.pack(len(payload)) + payload


def _length(header: bytes) -> int:
    (length,) = _HEADER.unpack(header)
    if length > MAX_FRAME_BYTES:
        raise FrameError(f"a frame of {length} bytes is longer than any we send")
    return int(length)


class BlockingLink:
    """The engine's end: whole frames in from one thread, out from any."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._reader = sock.makefile("rb")
        self._send_lock = threading.Lock()

    def send(self, message: Message) -> None:
        frame = encode(message)
        with self._send_lock:
            self._sock.sendall(frame)

    def receive(self, kind: type[M]) -> M | None:
        """The next message, or None once the other side closed the socket."""
        header = self._reader.read(_HEADER.size)
        if len(header) < _HEADER.size:
            return None
        length = _length(header)
        payload = self._reader.read(length)
        if len(payload) < length:
            return None
        message = kind()
        message.ParseFromString(payload)
        return message

    def close(self) -> None:
        self._reader.close()
        self._sock.close()

    def messages(self, kind: type[M]) -> Iterator[M]:
        """Every message until the other side closes the socket."""
        while (message := self.receive(kind)) is not None:
            yield message


async def read_message(reader: asyncio.StreamReader, kind: type[M]) -> M | None:
    """The front's end: the next message, or None once the engine's socket closed."""
    try:
        header = await reader.readexactly(_HEADER.size)
        payload = await reader.readexactly(_length(header))
    except asyncio.IncompleteReadError:
        return None
    message = kind()
    message.ParseFromString(payload)
    return message
