"""Responses produced ahead of a slow reader, so a slot is held for generating, not for waiting.

A streaming handler that yields straight from the generation holds its
concurrency slot (and its model) while gRPC waits to write each message: a
client that stops reading (an HTTP/2 window of 0) kept its slot for as long
as its connection lived, even after the generation had ended. Here the
generation runs in a task of its own and puts its responses in a buffer of
at most `max_bytes`; the handler writes them out as the client takes them.
When the generation ends, it lets go of its slot at once, whatever the
client has read; while the buffer is full it waits (the generation pauses),
and a stream that cannot write at all is cancelled by `service.front.rpc`'s send
deadline, which stops the generation with it. Both ports read Generate through
here: the OpenAI-compatible HTTP port writes each choice's events from this
buffer, under the same send deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncGenerator
from typing import Generic, Protocol, TypeVar


class Sized(Protocol):
    def ByteSize(self) -> int: ...


Message = TypeVar("Message", bound=Sized)


async def ahead_of_reader(
    source: AsyncGenerator[Message, None], max_bytes: int
) -> AsyncGenerator[Message, None]:
    """`source`'s messages, produced up to `max_bytes` ahead of the reader; its error
    is raised after the messages it produced before it."""
    buffer: _Buffer[Message] = _Buffer(max_bytes)
    producer = asyncio.create_task(buffer.fill(source))
    try:
        while True:
            message = await buffer.take()
            if message is None:
                break
            yield message
        await producer  # its error, if it failed
    finally:
        producer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await producer


class _Buffer(Generic[Message]):
    def __init__(self, max_bytes: int) -> None:
        self._max_bytes = max_bytes
        self._messages: deque[tuple[Message, int]] = deque()
        self._bytes = 0
        self._done = False
        self._changed = asyncio.Event()

    async def fill(self, source: AsyncGenerator[Message, None]) -> None:
        try:
            async for message in source:
                size = message.ByteSize()
                while self._messages and self._bytes + size > self._max_bytes:
                    await self._wait()  # the reader is behind: the generation pauses
                self._messages.append((message, size))
                self._bytes += size
                self._changed.set()
        finally:
            self._done = True
            self._changed.set()
            # Closed now, not when collected: what it holds (a slot, the model) goes now.
            await source.aclose()

    async def take(self) -> Message | None:
        """The next message; None once the source has ended and all were taken."""
        while not self._messages:
            if self._done:
                return None
            await self._wait()
        message, size = self._messages.popleft()
        self._bytes -= size
        self._changed.set()
        return message

    async def _wait(self) -> None:
        self._changed.clear()
        await self._changed.wait()
