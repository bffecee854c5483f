"""Validation of Generate requests, before any model is touched."""

from __future__ import annotations

import pytest

from inference.v1 import inference_pb2 as pb
from service.decode.loop import fit_max_tokens
from service.errors import InvalidRequest
from service.generation import GenerationRequest, SamplingDefaults


def parse(**fields: object) -> GenerationRequest:
    return GenerationRequest.from_pb(pb.GenerateRequest(**fields))  # type: ignore[arg-type]


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
    with pytest.raises(InvalidRequest, match="leaves no room"):
        fit_max_tokens(512, None, default=512, context_length=512)
