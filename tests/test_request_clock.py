"""Times count from the request reaching the server, as the contract says: the wait for a
server-wide concurrency slot is part of a text request's ttft_ms and queue_ms, and of an
image's total_ms and progress times.

The stream that holds the slot runs on the tiny random model (tests/tiny_model.py): what
it writes does not matter here, only that it runs while the second request waits.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import pytest

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from service.config import ModelConfig
from tests.conftest import (
    RunningServer,
    collect,
    eventually,
    finished_of,
    make_settings,
    serving,
)
from tests.test_external_image import wrapper

T = TypeVar("T")


def greedy(prompt: str, max_tokens: int) -> pb.GenerateRequest:
    return pb.GenerateRequest(prompt=prompt, max_tokens=max_tokens, temperature=0.0)


@pytest.fixture(scope="module")
def one_slot(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[RunningServer, pb_grpc.InferenceStub]]:
    """One concurrency slot for the whole server; text on the tiny model, images from
    the external command's stand-in."""
    command = wrapper(tmp_path_factory.mktemp("commands"), "mflux-generate", "ok")
    settings = make_settings(
        max_concurrent=1,
        image_command=str(command),
        models={"tiny": ModelConfig(source=str(tiny_model))},
        default_model="tiny",
    )
    with serving(settings) as running:
        yield running


def wait_behind_a_stream(
    running: RunningServer, stub: pb_grpc.InferenceStub, second: Callable[[], T]
) -> tuple[float, T]:
    """Run `second` while a text stream holds the server's one concurrency slot.

    Returns how long the client saw `second` wait for the slot, and its result.
    """
    gate = running.server.gate
    first = stub.Generate(greedy("Count: 1, 2, 3,", max_tokens=256))
    next(first)  # started: it holds the server's one slot
    with ThreadPoolExecutor(1) as client:
        result = client.submit(second)
        assert eventually(lambda: gate.waiting == 1)
        arrived_by = time.monotonic()  # the second reached the server before this
        still_waiting_at = arrived_by
        for _ in first:
            now = time.monotonic()
            if gate.waiting == 1:  # read after `now`: it had no slot yet at `now`
                still_waiting_at = now
        waited_ms = (still_waiting_at - arrived_by) * 1000
        assert waited_ms > 0
        return waited_ms, result.result(timeout=120)


def test_queue_ms_counts_the_wait_for_a_concurrency_slot(
    one_slot: tuple[RunningServer, pb_grpc.InferenceStub],
) -> None:
    running, stub = one_slot
    waited_ms, events = wait_behind_a_stream(
        running, stub, lambda: collect(stub.Generate(greedy("Hello", 2)))
    )
    # The server saw the request arrive before the client saw it wait, and start
    # after: it must count at least what the client saw.
    timing = finished_of(events).timing
    assert timing.queue_ms >= waited_ms
    assert timing.ttft_ms >= timing.queue_ms


def test_an_image_total_counts_the_wait_for_a_concurrency_slot(
    one_slot: tuple[RunningServer, pb_grpc.InferenceStub],
) -> None:
    running, stub = one_slot
    request = pb.GenerateImageRequest(model="schnell", prompt="a red apple", width=64, height=32)
    waited_ms, events = wait_behind_a_stream(
        running, stub, lambda: list(stub.GenerateImage(request))
    )
    assert events[-1].image.total_ms >= waited_ms
    assert events[0].progress.elapsed_ms >= waited_ms
