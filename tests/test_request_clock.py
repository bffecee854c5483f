"""ttft_ms and queue_ms count from the request reaching the server, as the contract says:
the wait for a server-wide concurrency slot is part of them."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from inference.v1 import inference_pb2 as pb
from tests.conftest import collect, finished_of, make_settings, serving


def greedy(prompt: str, max_tokens: int) -> pb.GenerateRequest:
    return pb.GenerateRequest(prompt=prompt, max_tokens=max_tokens, temperature=0.0)


def eventually(condition: Callable[[], bool]) -> bool:
    """Whether `condition` holds within a minute: a bound on a hang, not on speed."""
    deadline = time.monotonic() + 60
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def test_queue_ms_counts_the_wait_for_a_concurrency_slot() -> None:
    with serving(make_settings(max_concurrent=1)) as (running, stub):
        gate = running.server.gate
        first = stub.Generate(greedy("Count: 1, 2, 3,", max_tokens=64))
        next(first)  # started: it holds the server's one slot
        with ThreadPoolExecutor(1) as client:
            second = client.submit(lambda: collect(stub.Generate(greedy("Hello", 2))))
            assert eventually(lambda: gate.waiting == 1)
            arrived_by = time.monotonic()  # the second reached the server before this
            still_waiting_at = arrived_by
            for _ in first:
                now = time.monotonic()
                if gate.waiting == 1:  # read after `now`: it had no slot yet at `now`
                    still_waiting_at = now
            events = second.result(timeout=120)
    # The client saw the second request wait at least this long; the server, which
    # saw it arrive earlier and start later, must count at least as much.
    waited_ms = (still_waiting_at - arrived_by) * 1000
    timing = finished_of(events).timing
    assert waited_ms > 0
    assert timing.queue_ms >= waited_ms
    assert timing.ttft_ms >= timing.queue_ms
