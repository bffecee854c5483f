"""Overload control and per-request limits: refused at once, never hung, never INTERNAL."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator

import grpc
import pytest

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from service.errors import InvalidRequest, Overloaded
from service.front.limits import RequestLimits
from service.front.overload import ConcurrencyGate
from tests.conftest import RunningServer, make_settings, serving

# --- the gate, alone -------------------------------------------------------------------


async def _hold(gate: ConcurrencyGate, release: asyncio.Event) -> None:
    async with gate.slot():
        await release.wait()


def test_gate_queues_up_to_its_bound_then_refuses_at_once() -> None:
    async def scenario() -> None:
        gate = ConcurrencyGate(max_active=2, max_waiting=1, per_model_active=2, per_model_waiting=1)
        release = asyncio.Event()
        holders = [asyncio.create_task(_hold(gate, release)) for _ in range(3)]
        await asyncio.sleep(0)
        assert (gate.active, gate.waiting) == (2, 1)
        with pytest.raises(Overloaded, match="2 requests running and 1 waiting"):
            async with gate.slot():
                pass
        release.set()
        await asyncio.gather(*holders)
        assert (gate.active, gate.waiting) == (0, 0)

    asyncio.run(scenario())


async def _hold_model(gate: ConcurrencyGate, model: str, release: asyncio.Event) -> None:
    async with gate.slot(model):
        await release.wait()


def test_one_model_cannot_take_every_slot() -> None:
    async def scenario() -> None:
        gate = ConcurrencyGate(max_active=4, max_waiting=4)  # 3 and 3 per model
        release = asyncio.Event()
        busy = [asyncio.create_task(_hold_model(gate, "a", release)) for _ in range(6)]
        await asyncio.sleep(0)
        assert (gate.active, gate.waiting) == (3, 3)  # three more of a wait for its slots
        with pytest.raises(Overloaded, match="model 'a' busy: 3 of its requests running and 3"):
            async with gate.slot("a"):
                pass
        other = asyncio.create_task(_hold_model(gate, "b", release))
        await asyncio.sleep(0)
        assert gate.active == 4  # b still gets the slot a could not take
        release.set()
        await asyncio.gather(*busy, other)
        assert (gate.active, gate.waiting) == (0, 0)

    asyncio.run(scenario())


def test_gate_frees_the_place_of_a_cancelled_waiter() -> None:
    async def scenario() -> None:
        gate = ConcurrencyGate(max_active=1, max_waiting=1)
        release = asyncio.Event()
        holder = asyncio.create_task(_hold(gate, release))
        waiter = asyncio.create_task(_hold(gate, release))
        await asyncio.sleep(0)
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        assert (gate.active, gate.waiting) == (1, 0)
        release.set()
        await holder

    asyncio.run(scenario())


# --- request limits, alone -------------------------------------------------------------


def _request(
    prompt: str = "", messages: int = 0, max_tokens: int | None = None
) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        prompt=prompt,
        messages=[pb.ChatMessage(role="user", content="hi") for _ in range(messages)],
        max_tokens=max_tokens,
    )


LIMITS = RequestLimits(max_prompt_bytes=10, max_tokens=100, max_messages=2)


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (_request(prompt="é" * 6), "12 bytes"),  # bytes, not characters
        (_request(messages=3), "at most 2 messages"),
        (_request(prompt="hi", max_tokens=101), "at most 100"),
    ],
)
def test_limits_refuse_what_is_over(request_: pb.GenerateRequest, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        LIMITS.check(request_)


def test_limits_pass_what_is_at_the_bound() -> None:
    LIMITS.check(_request(prompt="x" * 10, max_tokens=100))
    with pytest.raises(InvalidRequest, match="12 bytes"):  # messages count role and content
        LIMITS.check(_request(messages=2))
    RequestLimits(max_prompt_bytes=12, max_tokens=1, max_messages=2).check(_request(messages=2))


# --- a real server ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def busy() -> Iterator[tuple[RunningServer, pb_grpc.InferenceStub]]:
    settings = make_settings(max_concurrent=1, max_queue=1, max_prompt_bytes=64, max_messages=2)
    with serving(settings) as running:
        yield running


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


LONG = pb.GenerateRequest(prompt="Count: 1, 2,", max_tokens=1000, temperature=0)


def test_past_the_queue_the_answer_is_resource_exhausted_at_once(
    busy: tuple[RunningServer, pb_grpc.InferenceStub],
) -> None:
    running, stub = busy
    gate = running.server.gate
    first = stub.Generate(LONG, timeout=60)
    next(first)  # started: it holds the only slot
    second = stub.Generate(LONG, timeout=60)
    _wait_for(lambda: gate.waiting == 1, "the second request to queue")
    with pytest.raises(grpc.RpcError) as caught:
        list(stub.Generate(pb.GenerateRequest(prompt="Hi", max_tokens=1), timeout=60))
    # At once: the first still holds its slot and the second still waits.
    assert (gate.active, gate.waiting) == (1, 1)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "server busy" in (caught.value.details() or "")
    first.cancel()
    assert next(second).WhichOneof("event") == "started"  # the queued one got the slot
    second.cancel()
    _wait_for(lambda: gate.active == 0 and gate.waiting == 0, "the slots to free")


def test_a_burst_of_clients_gets_answers_or_refusals_and_nothing_hangs(
    busy: tuple[RunningServer, pb_grpc.InferenceStub],
) -> None:
    _, stub = busy
    codes: list[grpc.StatusCode] = []
    request = pb.GenerateRequest(prompt="Once upon a time", max_tokens=64, temperature=0)

    def client() -> None:
        try:
            list(stub.Generate(request, timeout=60))
            codes.append(grpc.StatusCode.OK)
        except grpc.RpcError as error:
            codes.append(error.code())

    threads = [threading.Thread(target=client) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=90)
    assert not any(thread.is_alive() for thread in threads)
    assert len(codes) == 8
    assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}
    assert grpc.StatusCode.OK in codes
    assert grpc.StatusCode.RESOURCE_EXHAUSTED in codes


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (pb.GenerateRequest(prompt="x" * 65), "this server takes at most 64"),
        (
            pb.GenerateRequest(messages=[pb.ChatMessage(role="user", content="hi")] * 3),
            "at most 2 messages",
        ),
        (pb.GenerateRequest(prompt="hi", max_tokens=40000), "at most 32768"),
    ],
)
def test_requests_over_the_limits_are_invalid_argument(
    busy: tuple[RunningServer, pb_grpc.InferenceStub], request_: pb.GenerateRequest, message: str
) -> None:
    _, stub = busy
    with pytest.raises(grpc.RpcError) as caught:
        list(stub.Generate(request_, timeout=10))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in (caught.value.details() or "")
