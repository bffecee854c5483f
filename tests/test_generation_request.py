"""Validation of Generate requests, before any model is touched."""

from __future__ import annotations

import pytest

from inference.v1 import inference_pb2 as pb
from service.decode.sequence import fit_max_tokens
from service.errors import InvalidRequest
from service.front.conversion import generation_request
from service.text.requests import (
    Delta,
    GenerationLimits,
    GenerationRequest,
    Grammar,
    SamplingDefaults,
    TokenLogprob,
    TopLogprob,
)


def parse(**fields: object) -> GenerationRequest:
    return generation_request(pb.GenerateRequest(**fields))  # type: ignore[arg-type]


def test_unset_sampling_fields_take_the_model_defaults_not_proto_zeros() -> None:
    request = parse(prompt="hi", top_p=0.5)
    params = request.sampling.resolve(SamplingDefaults(temperature=0.7, top_k=20))
    assert (params.temperature, params.top_p, params.top_k) == (0.7, 0.5, 20)


def test_explicit_zero_temperature_is_kept() -> None:
    request = parse(prompt="hi", temperature=0.0, seed=0)
    params = request.sampling.resolve(SamplingDefaults())
    assert (params.temperature, params.seed) == (0.0, 0)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({}, "non-empty `prompt` or `messages`"),
        ({"prompt": "a", "messages": [pb.ChatMessage(role="user", content="b")]}, "not both"),
        ({"messages": [pb.ChatMessage(content="b")]}, "no role"),
        ({"prompt": "a", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "a", "max_tokens": -5}, "max_tokens"),
        ({"prompt": "a", "temperature": -0.1}, "temperature"),
        ({"prompt": "a", "top_p": 0.0}, "top_p"),
        ({"prompt": "a", "top_p": 1.5}, "top_p"),
        ({"prompt": "a", "top_k": -1}, "top_k"),
        ({"prompt": "a", "min_p": 2.0}, "min_p"),
        ({"prompt": "a", "repeat_penalty": 0.0}, "repeat_penalty"),
        ({"prompt": "a", "stop": [""]}, "stop"),
        ({"prompt": "a", "stop": ["x"] * 17}, "stop"),
    ],
)
def test_invalid_requests_are_refused_with_a_reason(
    fields: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidRequest, match=message.replace("`", ".")):
        parse(**fields)


def test_max_tokens_defaults_to_the_room_left() -> None:
    assert fit_max_tokens(100, None, default=512, context_length=300) == 200
    assert fit_max_tokens(10, None, default=512, context_length=4096) == 512


def test_context_guard_names_the_numbers() -> None:
    with pytest.raises(InvalidRequest, match=r"prompt \(100 tokens\) \+ max_tokens \(500\)"):
        fit_max_tokens(100, 500, default=512, context_length=512)
    with pytest.raises(InvalidRequest, match="leave no room"):
        fit_max_tokens(512, None, default=512, context_length=512)


WEATHER = pb.Tool(
    name="get_weather",
    description="The weather in a city.",
    parameters_json='{"type": "object", "properties": {"city": {"type": "string"}}}',
)


def test_tools_and_tool_turns_are_carried_over() -> None:
    call = pb.ToolCall(id="call_1", name="get_weather", arguments_json='{"city": "Paris"}')
    request = parse(
        messages=[
            pb.ChatMessage(role="user", content="Weather in Paris?"),
            pb.ChatMessage(role="assistant", tool_calls=[call]),
            pb.ChatMessage(role="tool", content='{"sky": "clear"}', tool_call_id="call_1"),
        ],
        tools=[WEATHER, pb.Tool(name="now")],
    )
    assert [tool.name for tool in request.tools] == ["get_weather", "now"]
    assert request.tools[0].parameters()["properties"] == {"city": {"type": "string"}}
    assert request.tools[1].parameters() == {"type": "object", "properties": {}}
    assistant, result = request.messages[1], request.messages[2]
    assert assistant.tool_calls[0].arguments() == {"city": "Paris"}
    assert (result.role, result.tool_call_id) == ("tool", "call_1")


def test_structured_output_and_logprobs_fields_are_resolved() -> None:
    schema = '{"type": "object", "properties": {"ok": {"type": "boolean"}}}'
    request = parse(
        prompt="a",
        response_format=pb.ResponseFormat(json_schema=schema),
        logprobs=True,
        top_logprobs=5,
    )
    assert request.grammar is not None
    assert "root ::=" in request.grammar.text
    assert (request.logprobs, request.top_logprobs) == (True, 5)
    plain = parse(prompt="a")
    assert (plain.grammar, plain.logprobs, plain.top_logprobs, plain.tools) == (None, False, 0, ())
    assert parse(prompt="a", grammar='root ::= "x"').grammar == Grammar('root ::= "x"')


def test_top_logprobs_is_bounded_by_the_servers_setting() -> None:
    msg = pb.GenerateRequest(prompt="a", logprobs=True, top_logprobs=8)
    assert generation_request(msg, GenerationLimits(max_top_logprobs=8)).top_logprobs == 8
    with pytest.raises(InvalidRequest, match="limited to 5"):
        generation_request(msg, GenerationLimits(max_top_logprobs=5))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"prompt": "a", "tools": [pb.Tool(description="x")]}, r"tools\[0\] has no name"),
        ({"prompt": "a", "tools": [pb.Tool(name="has space")]}, "letters, digits"),
        ({"prompt": "a", "tools": [WEATHER, WEATHER]}, "repeats the name"),
        ({"prompt": "a", "tools": [pb.Tool(name="f", parameters_json="[]")]}, "JSON object"),
        ({"prompt": "a", "tools": [pb.Tool(name="f", parameters_json="{")]}, "not valid JSON"),
        (
            {"prompt": "a", "grammar": 'root ::= "a"', "response_format": {"json_schema": "{}"}},
            "not both",
        ),
        ({"prompt": "a", "grammar": "root ::= nothing"}, "does not parse"),
        ({"prompt": "a", "response_format": {"json_schema": "{"}}, "not valid JSON"),
        ({"prompt": "a", "top_logprobs": 3}, "needs logprobs"),
        ({"prompt": "a", "logprobs": True, "top_logprobs": 21}, "limited to 20"),
        (
            {"messages": [pb.ChatMessage(role="user", tool_calls=[pb.ToolCall(name="f")])]},
            "only an assistant",
        ),
        (
            {
                "messages": [
                    pb.ChatMessage(
                        role="assistant", tool_calls=[pb.ToolCall(name="f", arguments_json="1")]
                    )
                ]
            },
            "must be a JSON object",
        ),
    ],
)
def test_invalid_generation_features_are_refused_with_a_reason(
    fields: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidRequest, match=message):
        parse(**fields)


def test_logprobs_travel_as_token_bytes_even_inside_a_character() -> None:
    first = TokenLogprob(
        1, b"\xc3", -0.25, (TopLogprob(1, b"\xc3", -0.25), TopLogprob(9, b"e", -2))
    )
    delta = Delta("é", (1, 2), (first, TokenLogprob(2, b"\xa9", 0.0)))
    message = delta.to_pb().delta
    assert [entry.token for entry in message.logprobs] == [b"\xc3", b"\xa9"]
    assert [top.token_id for top in message.logprobs[0].top_logprobs] == [1, 9]
    assert message.logprobs[0].logprob == pytest.approx(-0.25)
    assert Delta("a", (3,)).to_pb().delta.logprobs == []
