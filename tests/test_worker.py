"""The worker thread's channels deliver in order, relayed or not, and calls are not starved."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest

from service.engine.worker import Channel, ModelWorker


async def drain(channel: Channel[int], into: list[int]) -> None:
    async for item in channel:
        into.append(item)


@pytest.mark.parametrize("relayed", [False, True])
def test_a_channel_delivers_in_order_then_raises_the_closing_error(relayed: bool) -> None:
    received: list[int] = []

    async def scenario() -> None:
        worker = ModelWorker("test")
        channel: Channel[int] = Channel(asyncio.get_running_loop(), relayed)

        def produce() -> None:
            for item in range(100):
                channel.send(item)
            channel.close(ValueError("done badly"))

        worker.submit(produce)
        try:
            await drain(channel, received)
        finally:
            worker.shutdown()

    with pytest.raises(ValueError, match="done badly"):
        asyncio.run(scenario())
    assert received == list(range(100))


def test_a_call_runs_while_background_work_goes_on() -> None:
    async def scenario() -> int:
        worker = ModelWorker("test")
        steps = 0

        def step() -> bool:
            nonlocal steps
            steps += 1
            return steps < 100_000  # long background work

        worker.attach(step)
        worker.submit(lambda: None)  # wakes the thread, which then keeps stepping
        steps_when_called = await worker.call(lambda: steps)
        worker.shutdown()
        return steps_when_called

    assert asyncio.run(scenario()) < 100_000


def test_calls_sent_during_a_step_all_run_before_the_next_one() -> None:
    """A burst of requests must not wait one scheduler step per request ahead of it."""
    steps_seen: list[int] = []

    async def scenario() -> None:
        worker = ModelWorker("test")
        loop = asyncio.get_running_loop()
        stepping, release = asyncio.Event(), threading.Event()
        steps = 0

        def step() -> bool:
            nonlocal steps
            steps += 1
            if steps == 1:
                loop.call_soon_threadsafe(stepping.set)
                release.wait()  # a long forward pass, during which requests arrive
            return steps < 1_000

        def answering(future: asyncio.Future[int]) -> Callable[[], None]:
            """A call that answers with the steps taken when it runs."""

            def call() -> None:
                loop.call_soon_threadsafe(future.set_result, steps)

            return call

        worker.attach(step)
        worker.submit(lambda: None)
        await stepping.wait()
        answers = [loop.create_future() for _ in range(16)]
        for answer in answers:  # all sent during the pass, however long it takes
            worker.submit(answering(answer))
        release.set()
        steps_seen.extend(await asyncio.gather(*answers))
        worker.shutdown()

    asyncio.run(scenario())
    assert steps_seen == [1] * 16
