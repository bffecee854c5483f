"""Structured output, logprobs, seeds and tool calls, end to end with the real models."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterator

import grpc
import jsonschema
import pytest

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from service.config import ModelConfig
from service.models.embedded import EMBEDDED_MODELS
from tests.conftest import SMOLLM, collect, finished_of, make_settings, serving, text_of
from tests.test_chat_template_tools import QWEN25_TEMPLATE

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}

WEATHER = pb.Tool(
    name="get_weather",
    description="The current weather in a city.",
    parameters_json=json.dumps(
        {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    ),
)

# What a Hermes-style model writes to call get_weather, as a grammar: the
# model chooses the city; the test checks the service parses what it wrote.
CALL_GRAMMAR = r"""
root ::= "<tool_call>\n" call "\n</tool_call>"
call ::= "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"" city "\"}}"
city ::= [A-Z] [a-z]{1,10}
"""


def greedy(**fields: object) -> pb.GenerateRequest:
    return pb.GenerateRequest(temperature=0.0, **fields)  # type: ignore[arg-type]


def test_a_grammar_constrains_the_output(stub: pb_grpc.InferenceStub) -> None:
    grammar = 'root ::= ("yes" | "no") "."'
    events = collect(stub.Generate(greedy(prompt="Is the sky blue? Answer:", grammar=grammar)))
    assert text_of(events) in ("yes.", "no.")
    assert finished_of(events).finish_reason == pb.FINISH_REASON_END_OF_TURN


def test_a_json_schema_gives_json_that_validates(stub: pb_grpc.InferenceStub) -> None:
    request = greedy(
        messages=[pb.ChatMessage(role="user", content="Invent a person; reply in JSON.")],
        response_format=pb.ResponseFormat(json_schema=json.dumps(PERSON)),
        max_tokens=80,
    )
    events = collect(stub.Generate(request))
    jsonschema.validate(json.loads(text_of(events)), PERSON)


@pytest.mark.parametrize(
    ("question", "schema"),
    [
        (
            "In what year did the Berlin Wall fall? Reply in JSON.",
            {
                "type": "object",
                "properties": {"year": {"type": "integer", "minimum": 1990, "maximum": 1999}},
                "required": ["year"],
            },
        ),
        ("How many legs has a cat? Reply with a number.", {"type": "integer", "maximum": -2}),
    ],
)
def test_integer_bounds_hold_even_against_the_model_s_answer(
    stub: pb_grpc.InferenceStub, question: str, schema: dict[str, object]
) -> None:
    request = greedy(
        messages=[pb.ChatMessage(role="user", content=question)],
        response_format=pb.ResponseFormat(json_schema=json.dumps(schema)),
        max_tokens=24,
    )
    events = collect(stub.Generate(request))
    jsonschema.validate(json.loads(text_of(events)), schema)


def test_a_schema_the_converter_rejects_is_invalid_argument(stub: pb_grpc.InferenceStub) -> None:
    bad = pb.ResponseFormat(json_schema='{"type": "object", "properties": 7}')
    with pytest.raises(grpc.RpcError) as caught:
        collect(stub.Generate(greedy(prompt="hi", response_format=bad)))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_logprobs_come_with_each_token(stub: pb_grpc.InferenceStub) -> None:
    events = collect(
        stub.Generate(greedy(prompt="The sky is", max_tokens=5, logprobs=True, top_logprobs=3))
    )
    deltas = [e.delta for e in events if e.WhichOneof("event") == "delta"]
    entries = [entry for delta in deltas for entry in delta.logprobs]
    assert [entry.token_id for entry in entries] == [t for d in deltas for t in d.token_ids]
    for entry in entries:
        assert entry.logprob <= 0
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].token_id == entry.token_id  # greedy: the likeliest
        assert sum(math.exp(top.logprob) for top in entry.top_logprobs) <= 1.0001
    assert b"".join(entry.token for entry in entries).decode() == text_of(events)


def test_top_logprobs_beyond_the_bound_is_invalid_argument(stub: pb_grpc.InferenceStub) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        collect(stub.Generate(greedy(prompt="hi", logprobs=True, top_logprobs=10_000)))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def sampled(prompt: str, seed: int, top_k: int | None = None) -> pb.GenerateRequest:
    request = pb.GenerateRequest(prompt=prompt, max_tokens=24, temperature=1.0, seed=seed)
    if top_k is not None:
        request.top_k = top_k
    return request


def test_a_seed_repeats_a_sampled_text_on_a_model_without_cached_conversations() -> None:
    # Cached conversations move where a sequence's cells sit in the shared KV cache,
    # which changes the last bits of attention and so, at a near-tie, a draw.
    with serving(make_settings(cached_sequences=0)) as (_, stub):
        texts = [text_of(collect(stub.Generate(sampled("Once upon a time", 42)))) for _ in range(3)]
        other = text_of(collect(stub.Generate(sampled("Once upon a time", 43))))
    assert texts[0] == texts[1] == texts[2]
    assert other != texts[0]


@pytest.mark.parametrize("top_k", [None, 0], ids=["model's top-k", "no top-k: whole rows"])
def test_a_seeded_text_next_to_another_stream_starts_the_same(
    stub: pb_grpc.InferenceStub, top_k: int | None
) -> None:
    request = sampled("My favourite animal is", 7, top_k)
    alone = token_ids(collect(stub.Generate(request)))
    neighbour = stub.Generate(
        pb.GenerateRequest(prompt="Count: 1, 2,", max_tokens=60, temperature=0)
    )
    next(neighbour)
    beside = token_ids(collect(stub.Generate(request)))
    list(neighbour)
    # Its own random draws: the same tokens until, at worst, a near-tie decided by
    # last-bit differences (docs/api.md: what a seed guarantees).
    assert beside[:4] == alone[:4]


def token_ids(events: list[pb.GenerateResponse]) -> list[int]:
    return [t for e in events if e.WhichOneof("event") == "delta" for t in e.delta.token_ids]


@pytest.fixture(scope="module")
def tools_stub() -> Iterator[pb_grpc.InferenceStub]:
    """SmolLM2 with a Hermes-style (Qwen2.5) template, as an operator would configure it."""
    source = str(EMBEDDED_MODELS[SMOLLM].locate())
    models = {"hermes": ModelConfig(source=source, chat_template=QWEN25_TEMPLATE)}
    with serving(make_settings(models=models)) as (_, stub):
        yield stub


def test_a_tool_call_round_trip_through_the_template(tools_stub: pb_grpc.InferenceStub) -> None:
    question = pb.ChatMessage(role="user", content="What is the weather in Paris?")
    first = collect(
        tools_stub.Generate(
            greedy(model="hermes", messages=[question], tools=[WEATHER], grammar=CALL_GRAMMAR)
        )
    )
    finished = finished_of(first)
    assert finished.finish_reason == pb.FINISH_REASON_TOOL_CALL
    (call,) = finished.tool_calls
    assert call.name == "get_weather"
    city = json.loads(call.arguments_json)["city"]
    assert city.isalpha()
    assert "<tool_call>" not in finished.content
    result = pb.ChatMessage(role="tool", tool_call_id=call.id, content='{"celsius": 21}')
    turn = [question, pb.ChatMessage(role="assistant", tool_calls=[call]), result]
    second = collect(
        tools_stub.Generate(greedy(model="hermes", messages=turn, tools=[WEATHER], max_tokens=8))
    )
    # The call and its result went back through the template: the prompt grew by them.
    assert second[0].started.prompt_tokens > first[0].started.prompt_tokens + 10
    assert finished_of(second).usage.cached_prompt_tokens > 0


def test_without_tools_no_calls_are_parsed(tools_stub: pb_grpc.InferenceStub) -> None:
    events = collect(
        tools_stub.Generate(
            greedy(
                model="hermes",
                messages=[pb.ChatMessage(role="user", content="Hi")],
                grammar=CALL_GRAMMAR,
            )
        )
    )
    finished = finished_of(events)
    assert "<tool_call>" in text_of(events)
    assert not finished.tool_calls
    assert finished.finish_reason == pb.FINISH_REASON_END_OF_TURN


def test_concurrent_constrained_and_free_requests_share_the_model(
    stub: pb_grpc.InferenceStub,
) -> None:
    results: dict[str, str] = {}

    def run(name: str, request: pb.GenerateRequest) -> None:
        results[name] = text_of(collect(stub.Generate(request)))

    threads = [
        threading.Thread(target=run, args=("free", greedy(prompt="Count: 1, 2,", max_tokens=12))),
        threading.Thread(
            target=run,
            args=("digits", greedy(prompt="Pick:", grammar="root ::= [0-9]{3}", max_tokens=12)),
        ),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results["digits"].isdigit()
    assert len(results["digits"]) == 3
    assert not results["free"].isdigit()
