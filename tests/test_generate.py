"""Generate end to end: a real server, the real embedded models, the generated stubs."""

from __future__ import annotations

import itertools
import statistics
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from llama_cpp import Llama

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from service.models.embedded import EMBEDDED_MODELS
from tests.conftest import GEMMA, SMOLLM, collect, finished_of, make_settings, serving, text_of

FRANCE = "Q: What is the capital of France?\nA:"


def greedy(prompt: str, **fields: object) -> pb.GenerateRequest:
    return pb.GenerateRequest(prompt=prompt, temperature=0.0, **fields)  # type: ignore[arg-type]


def test_stream_is_started_then_deltas_then_finished(stub: pb_grpc.InferenceStub) -> None:
    events = collect(stub.Generate(greedy(FRANCE, model=GEMMA, max_tokens=8)))
    kinds = [e.WhichOneof("event") for e in events]
    assert kinds[0] == "started"
    assert kinds[-1] == "finished"
    assert set(kinds[1:-1]) == {"delta"}
    started = events[0].started
    assert (started.model, started.backend) == (GEMMA, "llama.cpp")
    assert started.prompt_tokens > 5
    finished = finished_of(events)
    assert finished.usage.prompt_tokens == started.prompt_tokens
    assert finished.usage.completion_tokens == sum(len(e.delta.token_ids) for e in events[1:-1])
    assert finished.timing.ttft_ms > 0
    assert finished.timing.total_ms >= finished.timing.ttft_ms
    assert "Paris" in text_of(events)


def test_max_tokens_ends_with_length(stub: pb_grpc.InferenceStub) -> None:
    finished = finished_of(collect(stub.Generate(greedy(FRANCE, model=GEMMA, max_tokens=3))))
    assert finished.finish_reason == pb.FINISH_REASON_LENGTH
    assert finished.usage.completion_tokens == 3


def test_a_repeated_greedy_request_reuses_the_prompt_cache(
    stub: pb_grpc.InferenceStub,
) -> None:
    request = greedy("The three primary colors are", max_tokens=24)
    first = collect(stub.Generate(request))
    second = collect(stub.Generate(request))
    assert text_of(first)
    # Exact repeats are tested without cached conversations (test_generation_features):
    # here the cache holds other tests' conversations, which may flip a late near-tie.
    assert text_of(first)[:20] == text_of(second)[:20]
    assert finished_of(second).usage.cached_prompt_tokens > 0


def test_the_seed_used_is_reported(stub: pb_grpc.InferenceStub) -> None:
    # That the same seed repeats the text is tested in test_generation_features.
    request = pb.GenerateRequest(prompt="Once upon a time", temperature=1.0, seed=42, max_tokens=4)
    assert finished_of(collect(stub.Generate(request))).seed == 42
    unseeded = pb.GenerateRequest(prompt="Once upon a time", temperature=1.0, max_tokens=4)
    assert len({finished_of(collect(stub.Generate(unseeded))).seed for _ in range(3)}) > 1


def test_stop_sequence_ends_generation_and_is_not_sent(stub: pb_grpc.InferenceStub) -> None:
    full = text_of(collect(stub.Generate(greedy(FRANCE, model=GEMMA, max_tokens=12))))
    assert "Paris" in full
    events = collect(stub.Generate(greedy(FRANCE, model=GEMMA, max_tokens=12, stop=["aris"])))
    finished = finished_of(events)
    assert finished.finish_reason == pb.FINISH_REASON_STOP_SEQUENCE
    assert finished.stop_sequence == "aris"
    # Not compared with `full` itself: the second request reuses the first's cached
    # prompt, and greedy text may then part from it at a near-tie (docs/api.md, "What
    # a seed guarantees"); on a shared server earlier tests' cache entries make that so.
    text = text_of(events)
    assert "aris" not in text
    assert text.endswith("P")


def test_chat_messages_use_the_model_template(stub: pb_grpc.InferenceStub) -> None:
    question = "What is 2+2?"
    request = pb.GenerateRequest(
        model=SMOLLM,
        messages=[pb.ChatMessage(role="user", content=question)],
        temperature=0.0,
        max_tokens=48,
    )
    events = collect(stub.Generate(request))
    assert finished_of(events).finish_reason == pb.FINISH_REASON_END_OF_TURN
    # The same conversation through llama-cpp-python's own chat handler.
    raw = Llama(str(EMBEDDED_MODELS[SMOLLM].locate()), n_ctx=256, n_threads=1, verbose=False)
    try:
        expected: Any = raw.create_chat_completion(
            messages=[{"role": "user", "content": question}], max_tokens=48, temperature=0.0
        )
    finally:
        raw.close()
    assert text_of(events) == expected["choices"][0]["message"]["content"]
    assert "4" in text_of(events)


def test_chat_on_a_model_without_template_is_failed_precondition(
    stub: pb_grpc.InferenceStub,
) -> None:
    request = pb.GenerateRequest(model=GEMMA, messages=[pb.ChatMessage(role="user", content="hi")])
    with pytest.raises(grpc.RpcError) as caught:
        collect(stub.Generate(request))
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "chat template" in (caught.value.details() or "")


@pytest.fixture(scope="module")
def one_at_a_time() -> Iterator[pb_grpc.InferenceStub]:
    """A server that decodes one sequence at a time, so a request waits for the one before."""
    with serving(make_settings(parallel_sequences=1)) as (_, stub):
        yield stub


def test_cancel_mid_stream_frees_the_model(one_at_a_time: pb_grpc.InferenceStub) -> None:
    stub = one_at_a_time
    call = stub.Generate(greedy("Count: 1, 2, 3,", max_tokens=800))
    arrivals: list[float] = []
    for event in call:
        if event.WhichOneof("event") == "delta":
            arrivals.append(time.monotonic())
        if len(arrivals) == 6:
            call.cancel()
            break
    assert call.code() == grpc.StatusCode.CANCELLED
    token_seconds = statistics.median(b - a for a, b in itertools.pairwise(arrivals))
    finished = finished_of(collect(stub.Generate(greedy("Hello", max_tokens=2))))
    # Measured in the model's own token time, so it holds on any machine: had the
    # cancelled stream gone on decoding, this request would wait ~794 tokens for it.
    assert finished.timing.queue_ms / 1000 < 100 * token_seconds


def test_deadline_is_deadline_exceeded_and_the_model_stays_usable(
    stub: pb_grpc.InferenceStub,
) -> None:
    probe = finished_of(collect(stub.Generate(greedy("Count:", max_tokens=8))))
    rate = max(probe.timing.decode_tokens_per_second, 1.0)
    # A deadline at a tenth of what 900 tokens take here, whatever the machine's speed.
    deadline = min(0.5, 900 / rate / 10)
    with pytest.raises(grpc.RpcError) as caught:
        collect(stub.Generate(greedy("Count:", max_tokens=900), timeout=deadline))
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    finished = finished_of(collect(stub.Generate(greedy("Hello", max_tokens=2))))
    assert finished.usage.completion_tokens == 2


def test_concurrent_streams_on_one_model_all_complete(stub: pb_grpc.InferenceStub) -> None:
    results: list[str] = []

    def run() -> None:
        results.append(text_of(collect(stub.Generate(greedy("Hello, my name is", max_tokens=8)))))

    threads = [threading.Thread(target=run) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 3
    # Decoded in one batch; requests joining at different steps may drift late on.
    assert len({text[:8] for text in results}) == 1


LONG_PROMPT = "word " * 2000


@pytest.mark.parametrize(
    ("request_fields", "code", "message"),
    [
        ({"model": "no-such-model", "prompt": "hi"}, grpc.StatusCode.NOT_FOUND, "no model named"),
        ({"prompt": ""}, grpc.StatusCode.INVALID_ARGUMENT, "prompt"),
        ({"messages": []}, grpc.StatusCode.INVALID_ARGUMENT, "messages"),
        ({"prompt": "hi", "max_tokens": -1}, grpc.StatusCode.INVALID_ARGUMENT, "max_tokens"),
        ({"prompt": "hi", "max_tokens": 20000}, grpc.StatusCode.INVALID_ARGUMENT, "context window"),
        ({"prompt": "hi", "max_tokens": 10**9}, grpc.StatusCode.INVALID_ARGUMENT, "at most 32768"),
        ({"prompt": "hi", "temperature": -1}, grpc.StatusCode.INVALID_ARGUMENT, "temperature"),
        ({"prompt": "hi", "top_p": 0}, grpc.StatusCode.INVALID_ARGUMENT, "top_p"),
        ({"prompt": "hi", "top_p": 1.01}, grpc.StatusCode.INVALID_ARGUMENT, "top_p"),
        ({"prompt": LONG_PROMPT}, grpc.StatusCode.INVALID_ARGUMENT, "context window"),
    ],
)
def test_bad_requests_get_the_right_status_and_the_server_keeps_serving(
    stub: pb_grpc.InferenceStub,
    request_fields: dict[str, object],
    code: grpc.StatusCode,
    message: str,
) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        collect(stub.Generate(pb.GenerateRequest(**request_fields)))  # type: ignore[arg-type]
    assert caught.value.code() == code
    assert message in (caught.value.details() or "")
    assert finished_of(collect(stub.Generate(greedy("Hi", max_tokens=1)))).usage.completion_tokens


def test_list_models_shows_the_embedded_models(stub: pb_grpc.InferenceStub) -> None:
    reply = stub.ListModels(pb.ListModelsRequest())
    by_name = {model.name: model for model in reply.models}
    assert {GEMMA, SMOLLM} <= set(by_name)
    assert reply.default_model == SMOLLM
    assert by_name[SMOLLM].is_default
    assert by_name[SMOLLM].loaded
    assert by_name[SMOLLM].backend == "llama.cpp"
