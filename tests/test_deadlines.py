"""A deadline ends the work wherever the request is (issue 46).

Deadlines are swept across the stages a request passes through: waiting for a
concurrency slot, waiting for a place in the engine's batch, loading its model,
prefilling a long prompt, decoding to a client that reads, and decoding to a
client that reads nothing (the server blocked in a write, the generation ahead
of it in the outbox). Every call must end DEADLINE_EXCEEDED, and within a second
of the last deadline no slot is held, nothing waits, and no engine is still
generating: a leaked generation decodes to max_tokens for tens of seconds.
Across the stages the sweep runs well over 200 deadlines.
"""

from __future__ import annotations

import functools
import random
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from service.config import ModelConfig
from tests.conftest import SMOLLM, RunningServer, make_settings, serving

SLOTS = 4  # --parallel-sequences; twice as many may hold a slot (--max-concurrent)
# SmolLM2's end-of-generation ids, never sampled: every generation would run to
# max_tokens, tens of seconds on one thread, if a deadline failed to end it.
NEVER_ENDS = {0: -100.0, 2: -100.0}
LONG = 900
WORDS = ("the", "ship", "sailed", "past", "a", "lighthouse", "while", "crew", "sang", "of", "rain")


def _prompt(rng: random.Random, words: int) -> str:
    """A distinct prompt of about `words` words, so no two share a cached answer."""
    return " ".join(rng.choice(WORDS) for _ in range(words)) + f" {rng.random()}"


def _request(prompt: str, model: str = SMOLLM, **fields: object) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        model=model,
        prompt=prompt,
        max_tokens=LONG,
        temperature=0.8,
        logit_bias=NEVER_ENDS,
        **fields,  # type: ignore[arg-type]
    )


@pytest.fixture(scope="module")
def deadlines(tiny_model: Path) -> Iterator[tuple[RunningServer, pb_grpc.InferenceStub]]:
    settings = make_settings(
        context_size=4096,
        # A cancel takes effect between steps, or mid-step once nobody in the step
        # is still wanted; 128 prompt tokens a step keep the others' steps short.
        batch_size=128,
        parallel_sequences=SLOTS,
        max_concurrent=2 * SLOTS,  # twice the batch: some wait in the engine's queue
        max_concurrent_per_model=2 * SLOTS,
        max_queue=64,
        models={"tiny": ModelConfig(source=str(tiny_model))},
        max_loaded_models=1,  # alternating two models loads one each time
        log_level="error",
    )
    with serving(settings) as running:
        yield running


def _read(stub: pb_grpc.InferenceStub, request: pb.GenerateRequest, timeout: float) -> str:
    """The status of a call read to its end."""
    try:
        for _ in stub.Generate(request, timeout=timeout):
            pass
    except grpc.RpcError as error:
        return error.code().name
    return "OK"


def _unread(stub: pb_grpc.InferenceStub, request: pb.GenerateRequest, timeout: float) -> str:
    """The status of a call whose messages are never read: once the HTTP/2 window is
    full, the server waits in its write until the deadline."""
    call = stub.Generate(request, timeout=timeout)
    code: grpc.StatusCode = call.code()  # waits for the end
    return str(code.name)


Reader = Callable[[pb_grpc.InferenceStub, pb.GenerateRequest, float], str]


def _calls(
    read: Reader,
    stub: pb_grpc.InferenceStub,
    rng: random.Random,
    count: int,
    words: int,
    seconds: tuple[float, float],
    **fields: Any,
) -> list[Callable[[], str]]:
    """`count` calls of distinct prompts of `words` words, each with a deadline drawn
    from `seconds`."""
    requests = [_request(_prompt(rng, words), **fields) for _ in range(count)]
    return [functools.partial(read, stub, request, rng.uniform(*seconds)) for request in requests]


def _settled(running: RunningServer, holding: int = 0) -> Callable[[], str]:
    """What is held beyond `holding` requests' slots and sequences ("" when nothing)."""

    def held() -> str:
        gate = running.server.gate
        engines = [model.engine for model in running.server.pool.loaded()]
        state = {
            "slots held": gate.active,
            "waiting for a slot": gate.waiting,
            "sequences running": sum(engine.running for engine in engines),
            "sequences waiting": sum(engine.waiting for engine in engines),
        }
        expected = {**dict.fromkeys(state, 0), "slots held": holding}
        expected["sequences running"] = min(holding, SLOTS)
        expected["sequences waiting"] = holding - min(holding, SLOTS)
        return "" if state == expected else f"{state}, expected {expected}"

    return held


def _within_a_second(held: Callable[[], str], what: str) -> None:
    deadline = time.monotonic() + 1.0
    while state := held():
        assert time.monotonic() < deadline, f"a second after the deadlines ({what}): {state}"
        time.sleep(0.01)


def _swept(
    running: RunningServer,
    calls: list[Callable[[], str]],
    what: str,
    holding: int = 0,
) -> None:
    """Run `calls` 2 * SLOTS at a time (half of them wait for a place in the batch);
    every one must end DEADLINE_EXCEEDED, and within a second of each round everything
    they held must be free."""
    at_once = 2 * SLOTS
    for start in range(0, len(calls), at_once):
        with ThreadPoolExecutor(max_workers=at_once) as pool:
            codes = list(pool.map(lambda call: call(), calls[start : start + at_once]))
        assert codes == ["DEADLINE_EXCEEDED"] * len(codes), (what, codes)
        _within_a_second(_settled(running, holding), what)


def test_deadlines_while_decoding_to_a_reader(
    deadlines: tuple[RunningServer, pb_grpc.InferenceStub],
) -> None:
    running, stub = deadlines
    rng = random.Random(1)
    calls = _calls(_read, stub, rng, 80, words=20, seconds=(0.05, 1.2))
    _swept(running, calls, "decoding")


def test_deadlines_while_the_server_waits_to_write(
    deadlines: tuple[RunningServer, pb_grpc.InferenceStub],
) -> None:
    running, stub = deadlines
    rng = random.Random(2)
    # Twenty alternatives a token: the client's window is full within a few dozen.
    wordy = {"logprobs": True, "top_logprobs": 20}
    calls = _calls(_unread, stub, rng, 48, words=20, seconds=(0.3, 1.2), **wordy)
    _swept(running, calls, "writing")


def test_deadlines_while_prefilling_a_long_prompt(
    deadlines: tuple[RunningServer, pb_grpc.InferenceStub],
) -> None:
    running, stub = deadlines
    rng = random.Random(3)
    calls = _calls(_read, stub, rng, 32, words=1800, seconds=(0.05, 0.8))
    _swept(running, calls, "prefilling")


def _blockers(
    stub: pb_grpc.InferenceStub, count: int, rng: random.Random
) -> tuple[list[grpc.Future], threading.Thread]:  # type: ignore[type-arg]
    """`count` long generations read on a thread of their own, holding their slots.

    When all fit in the batch, each has decoded a token before this returns: the
    requests queued behind them then wait for a place while they decode, and not
    behind their prompts' steps (seconds each on one thread), which no cancel of
    another request interrupts."""
    calls = [stub.Generate(_request(_prompt(rng, 20)), timeout=120) for _ in range(count)]
    if count <= SLOTS:
        for call in calls:
            while next(call).WhichOneof("event") != "delta":
                pass

    def drain() -> None:
        for call in calls:
            try:
                for _ in call:
                    pass
            except grpc.RpcError:
                pass

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    return calls, reader


def _states(calls: list[Any]) -> list[str]:
    """How each call stands (grpc's call objects): running, or its status and message."""
    return [f"{c.code().name}: {c.details()}" if c.done() else "running" for c in calls]


def _ended(calls: list[grpc.Future], reader: threading.Thread) -> None:  # type: ignore[type-arg]
    for call in calls:
        call.cancel()
    reader.join(timeout=30)


@pytest.mark.parametrize(
    ("holding", "stage"),
    [(2 * SLOTS, "waiting for a slot"), (SLOTS, "waiting for a place in the batch")],
)
def test_deadlines_while_queued(
    deadlines: tuple[RunningServer, pb_grpc.InferenceStub], holding: int, stage: str
) -> None:
    running, stub = deadlines
    rng = random.Random(4 + holding)
    calls, reader = _blockers(stub, holding, rng)
    try:
        _wait_for_blockers(running, holding)
        queued = _calls(_read, stub, rng, 24, words=20, seconds=(0.05, 0.5))
        try:
            _swept(running, queued, stage, holding=holding)
        except AssertionError as failure:  # a blocker that ended early would explain it
            raise AssertionError(f"{failure}; blockers: {_states(calls)}") from None
        assert not any(call.done() for call in calls), _states(calls)  # held throughout
    finally:
        _ended(calls, reader)
    _within_a_second(_settled(running), f"the blockers of {stage!r}")


def _wait_for_blockers(running: RunningServer, holding: int) -> None:
    """Wait for the blockers to hold their slots (the first may load the model)."""
    deadline = time.monotonic() + 60
    while running.server.gate.active < holding:
        assert time.monotonic() < deadline, "the blockers never started"
        time.sleep(0.02)


def test_deadlines_while_the_model_loads(
    deadlines: tuple[RunningServer, pb_grpc.InferenceStub],
) -> None:
    running, stub = deadlines
    rng = random.Random(5)
    ended = []
    for turn in range(16):
        model = "tiny" if turn % 2 == 0 else SMOLLM
        # One at a time: each is for the model not loaded, so it waits for a load.
        ended.append(_read(stub, _request(_prompt(rng, 20), model=model), rng.uniform(0.02, 0.2)))
        _within_a_second(_settled(running), "loading")
    assert ended == ["DEADLINE_EXCEEDED"] * len(ended)
