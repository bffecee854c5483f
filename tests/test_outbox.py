"""ahead_of_reader: a producer ahead of its reader by a bounded number of bytes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import pytest

from inference.v1 import inference_pb2 as pb
from service.errors import Unavailable
from service.serving.outbox import ahead_of_reader


def _delta(text: str) -> pb.GenerateResponse:
    return pb.GenerateResponse(delta=pb.TextDelta(text=text))


def test_the_producer_runs_ahead_by_the_bytes_allowed_and_then_waits() -> None:
    produced: list[str] = []

    async def source() -> AsyncGenerator[pb.GenerateResponse, None]:
        for text in ["aaaa", "bbbb", "cccc", "dddd", "eeee", "ffff"]:
            produced.append(text)
            yield _delta(text)

    async def scenario() -> None:
        size = _delta("aaaa").ByteSize()
        reader = ahead_of_reader(source(), max_bytes=2 * size)
        first = await reader.__anext__()
        assert first.delta.text == "aaaa"
        await asyncio.sleep(0.05)  # the reader takes nothing more for a while
        # One taken, two buffered, the fourth in hand waiting for room: no further.
        assert produced == ["aaaa", "bbbb", "cccc", "dddd"]
        rest = [response.delta.text async for response in reader]
        assert rest == ["bbbb", "cccc", "dddd", "eeee", "ffff"]

    asyncio.run(scenario())


def test_the_producers_error_follows_what_it_produced_before_it() -> None:
    async def source() -> AsyncGenerator[pb.GenerateResponse, None]:
        yield _delta("one")
        raise Unavailable("the engine died")

    taken: list[str] = []

    async def collect() -> None:
        async for response in ahead_of_reader(source(), 1 << 20):
            taken.append(response.delta.text)

    with pytest.raises(Unavailable, match="the engine died"):
        asyncio.run(collect())
    assert taken == ["one"]


def test_a_reader_that_leaves_stops_the_producer() -> None:
    stopped = asyncio.Event()

    async def source() -> AsyncGenerator[pb.GenerateResponse, None]:
        try:
            while True:
                yield _delta("x")
        finally:
            stopped.set()

    async def scenario() -> None:
        reader = ahead_of_reader(source(), 64)
        await reader.__anext__()
        await reader.aclose()
        assert stopped.is_set()

    asyncio.run(scenario())
