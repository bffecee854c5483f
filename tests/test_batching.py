"""Concurrent generations on one model decode together, each on its own terms."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import grpc
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
    text_of,
)

T = TypeVar("T")

PROMPTS = (
    "The three primary colours are",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The French word for cat is",
)


def greedy(prompt: str, max_tokens: int = 12, **fields: object) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=0.0,
        **fields,  # type: ignore[arg-type]
    )


def token_ids(events: list[pb.GenerateResponse]) -> list[int]:
    return [t for e in events if e.WhichOneof("event") == "delta" for t in e.delta.token_ids]


def all_at_once(calls: list[Callable[[], T]]) -> list[T]:
    """Run the calls on threads released together, so their requests overlap."""
    barrier = threading.Barrier(len(calls))

    def run(call: Callable[[], T]) -> T:
        barrier.wait()
        return call()

    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        return list(pool.map(run, calls))


@pytest.fixture(scope="module", params=["unified", "per-sequence"])
def batching(
    request: pytest.FixtureRequest, tiny_model: Path
) -> Iterator[tuple[RunningServer, pb_grpc.InferenceStub]]:
    """A server batching four sequences, with either KV cache layout: SmolLM2, and the
    tiny random model as "tiny" for streams whose words do not matter."""
    settings = make_settings(
        parallel_sequences=4,
        cached_sequences=4,
        kv_layout=request.param,
        models={"tiny": ModelConfig(source=str(tiny_model))},
    )
    with serving(settings) as running:
        yield running


def test_identical_prompts_arriving_together_agree(
    batching: tuple[RunningServer, pb_grpc.InferenceStub],
) -> None:
    _, stub = batching
    results = all_at_once([lambda: collect(stub.Generate(greedy(PROMPTS[0])))] * 4)
    # Requests that join at different steps see their prompts evaluated in batches of
    # different shapes, so greedy text may drift after a while (test_llama_batching
    # checks that prompts in the very same step agree token for token).
    assert len({tuple(token_ids(events)[:4]) for events in results}) == 1
    assert all(finished_of(events).usage.completion_tokens == 12 for events in results)


def test_each_batched_stream_continues_its_own_prompt(
    batching: tuple[RunningServer, pb_grpc.InferenceStub],
) -> None:
    _, stub = batching
    alone = [token_ids(collect(stub.Generate(greedy(prompt)))) for prompt in PROMPTS]

    def run(prompt: str) -> Callable[[], list[pb.GenerateResponse]]:
        return lambda: collect(stub.Generate(greedy(prompt)))

    together = all_at_once([run(prompt) for prompt in PROMPTS])
    for index, events in enumerate(together):
        ids = token_ids(events)
        # Batched arithmetic may drift from a lone run after some tokens, never at once.
        assert ids[:4] == alone[index][:4], PROMPTS[index]
        others = [alone[i][:4] for i in range(len(PROMPTS)) if i != index]
        assert ids[:4] not in others


def test_batched_streams_keep_their_own_limits_stops_and_cancellation(
    batching: tuple[RunningServer, pb_grpc.InferenceStub],
) -> None:
    _, stub = batching
    reference = text_of(collect(stub.Generate(greedy(PROMPTS[2], max_tokens=20))))
    stop = reference.split()[3]  # a word the model will write in the same run

    def cancelled_after_two() -> str:
        call = stub.Generate(greedy("Count: 1, 2, 3,", max_tokens=200))
        deltas = 0
        for event in call:
            deltas += event.WhichOneof("event") == "delta"
            if deltas == 2:
                call.cancel()
                break
        return str(call.code().name)

    def finished(request: pb.GenerateRequest) -> pb.GenerationFinished:
        return finished_of(collect(stub.Generate(request)))

    outcomes: list[pb.GenerationFinished | str] = all_at_once(
        [
            lambda: finished(greedy(PROMPTS[0], max_tokens=3)),
            lambda: finished(greedy(PROMPTS[1], max_tokens=9)),
            lambda: finished(greedy(PROMPTS[2], max_tokens=20, stop=[stop])),
            cancelled_after_two,
        ]
    )
    short, longer, stopped, cancelled = outcomes
    assert isinstance(short, pb.GenerationFinished)
    assert isinstance(longer, pb.GenerationFinished)
    assert isinstance(stopped, pb.GenerationFinished)
    assert (short.usage.completion_tokens, short.finish_reason) == (3, pb.FINISH_REASON_LENGTH)
    assert (longer.usage.completion_tokens, longer.finish_reason) == (9, pb.FINISH_REASON_LENGTH)
    assert stopped.finish_reason == pb.FINISH_REASON_STOP_SEQUENCE
    assert stopped.stop_sequence == stop
    assert cancelled == "CANCELLED"


def test_a_newcomer_streams_while_a_long_generation_runs(
    batching: tuple[RunningServer, pb_grpc.InferenceStub],
) -> None:
    running, stub = batching
    long_call = stub.Generate(greedy("Count: 1, 2, 3,", max_tokens=400, model="tiny"))
    next(long_call)  # started
    next(long_call)  # its first token: it is decoding now
    (model,) = [m for m in running.server.pool.loaded() if m.name == "tiny"]
    newcomer = collect(stub.Generate(greedy("Hello", max_tokens=3, model="tiny")))
    # Served one after another, the newcomer would start only once the long one
    # ended; batched, it ends ~390 tokens before the long one does.
    long_still_running = model.engine.running
    rest = list(long_call)
    assert finished_of(newcomer).usage.completion_tokens == 3
    assert long_still_running == 1
    assert finished_of(rest).usage.completion_tokens == 400


def test_a_second_turn_evaluates_only_its_new_tokens(
    batching: tuple[RunningServer, pb_grpc.InferenceStub],
) -> None:
    _, stub = batching

    def turn(history: list[pb.ChatMessage]) -> list[pb.GenerateResponse]:
        return collect(
            stub.Generate(pb.GenerateRequest(messages=history, max_tokens=16, temperature=0))
        )

    conversation = [pb.ChatMessage(role="user", content="Name a fruit.")]
    first = turn(conversation)
    conversation += [
        pb.ChatMessage(role="assistant", content=text_of(first)),
        pb.ChatMessage(role="user", content="And a vegetable?"),
    ]
    other = [pb.ChatMessage(role="user", content="What is two plus two?")]
    turn(other)  # another conversation in between keeps its own slot
    second = turn(conversation)
    first_prompt = first[0].started.prompt_tokens
    assert finished_of(second).usage.cached_prompt_tokens >= first_prompt
    assert finished_of(turn(other)).usage.cached_prompt_tokens > 0


def test_a_cached_turn_gives_the_tokens_of_a_cold_run() -> None:
    prompt = "The capital of Italy is Rome. The capital of Spain is"
    request = greedy(prompt, max_tokens=10)
    with serving(make_settings(parallel_sequences=1, cached_sequences=1)) as (_, stub):
        cold = collect(stub.Generate(request))
        warm = collect(stub.Generate(request))
    assert finished_of(cold).usage.cached_prompt_tokens == 0
    assert finished_of(warm).usage.cached_prompt_tokens == finished_of(cold).usage.prompt_tokens - 1
    assert token_ids(warm) == token_ids(cold)


def test_beyond_the_waiting_bound_requests_are_refused_at_once() -> None:
    settings = make_settings(parallel_sequences=1, max_waiting_sequences=0)
    with serving(settings) as (running, stub):
        (model,) = running.server.pool.loaded()
        occupying = stub.Generate(greedy("Count: 1, 2, 3,", max_tokens=400))
        next(occupying)
        next(occupying)  # decoding: the model's one place is taken
        with pytest.raises(grpc.RpcError) as caught:
            collect(stub.Generate(greedy("Hello", max_tokens=2)))
        # At once: refused while the one ahead still ran, not after it ended.
        assert model.engine.running == 1
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "retry" in (caught.value.details() or "")
        occupying.cancel()
        # The cancel reaches the engine on its own time; until it has, the place is taken.
        assert eventually(lambda: model.engine.running == 0)
        assert (
            finished_of(
                collect(stub.Generate(greedy("Hello", max_tokens=2)))
            ).usage.completion_tokens
            == 2
        )


def test_stopping_the_server_mid_stream_ends_the_stream_and_closes_the_model() -> None:
    running = RunningServer(make_settings(grace_period=0))
    channel = grpc.insecure_channel(running.target)
    stub = pb_grpc.InferenceStub(channel)
    stream = stub.Generate(greedy("Count: 1, 2, 3,", max_tokens=400))
    next(stream)
    next(stream)  # decoding
    engine = running.server.pool.loaded()[0].engine
    running.stop()
    with pytest.raises(grpc.RpcError) as caught:
        list(stream)
    assert caught.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
    assert engine.pid is not None
    with pytest.raises(ProcessLookupError):  # the engine freed its model and exited
        os.kill(engine.pid, 0)
    channel.close()


def test_a_prompt_repeated_after_a_long_answer_is_served_again(
    batching: tuple[RunningServer, pb_grpc.InferenceStub],
) -> None:
    # Issue 46: the same prompt sent again to the idle server that had just given it
    # an answer filling most of the cache was refused "no room", because the cached
    # conversation it would copy its prefix from could not be evicted.
    _, stub = batching
    prompt = " ".join(f"item {i}," for i in range(40))
    never_ends = {0: -100.0, 2: -100.0}  # SmolLM2's vocabulary's end ids
    probe = collect(stub.Generate(greedy(prompt, 1, model="tiny")))
    (started,) = [event.started for event in probe if event.WhichOneof("event") == "started"]
    # The whole window: the first answer and its repeat cannot both fit the cache.
    longest = started.context_length - started.prompt_tokens
    for _ in range(3):
        request = greedy(prompt, longest, model="tiny", logit_bias=never_ends)
        finished = finished_of(collect(stub.Generate(request)))
        assert finished.usage.completion_tokens == longest
