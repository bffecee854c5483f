"""The JSON budget of an HTTP body, at its seam: counted on the raw bytes before any
parse, and lone surrogates found by name after it (service.front.openai_api.json_budget)."""

from __future__ import annotations

import json

import pytest

from service.errors import InvalidRequest
from service.front.openai_api.json_budget import (
    MAX_CONTAINERS,
    MAX_ITEMS,
    check_json_budget,
    refuse_lone_surrogates,
)
from service.front.openai_api.requests import parse_body


def test_a_body_at_the_item_budget_passes_and_one_more_is_refused() -> None:
    at = b'{"tokens": [' + b"1," * (MAX_ITEMS - 3) + b"1]}"
    check_json_budget(at)
    past = b'{"tokens": [' + b"1," * MAX_ITEMS + b"1]}"
    with pytest.raises(InvalidRequest, match=str(MAX_ITEMS)):
        check_json_budget(past)


def test_containers_have_a_budget_of_their_own() -> None:
    past = b'{"x": [' + b"{}," * MAX_CONTAINERS + b"{}]}"
    with pytest.raises(InvalidRequest, match="objects and arrays"):
        check_json_budget(past)


def test_a_lone_surrogate_is_named_by_its_path_and_a_pair_passes() -> None:
    paired = json.dumps({"messages": [{"content": "\U0001f600"}]}).encode()
    assert b"\\ud83d\\ude00" in paired
    assert parse_body(paired)["messages"][0]["content"] == "\U0001f600"
    lone = json.dumps({"messages": [{"role": "user", "content": "a\ud800b"}]}).encode()
    with pytest.raises(InvalidRequest, match=r"messages\[0\]\.content.*surrogate") as refused:
        parse_body(lone)
    assert refused.value.param == "messages"


def test_a_surrogate_in_a_key_is_refused_too() -> None:
    raw = b'{"\\udc00": 1}'
    with pytest.raises(InvalidRequest, match="surrogate"):
        refuse_lone_surrogates(raw, json.loads(raw))


def test_an_escaped_backslash_before_u_is_no_surrogate() -> None:
    raw = b'{"prompt": "\\\\ud800"}'  # the text \ud800, six characters
    assert parse_body(raw)["prompt"] == "\\ud800"
