"""The Responses translation's bounds at its seam (issue 45): `metadata` as OpenAI
bounds it, since every answer echoes it back, and a function call's output only for
a call that was made."""

from __future__ import annotations

from typing import Any

import pytest

from service.errors import InvalidRequest
from service.front.openai_api.conversations import History
from service.front.openai_api.responses_api import (
    MAX_METADATA_KEY,
    MAX_METADATA_PAIRS,
    MAX_METADATA_VALUE,
    translated_responses_request,
)

CALL = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"}


def _translated(**body: Any) -> Any:
    return translated_responses_request({"input": "Hi", **body}, History())


def test_metadata_within_openai_s_bounds_passes() -> None:
    metadata = {f"k{n}".ljust(MAX_METADATA_KEY, "x"): "v" * MAX_METADATA_VALUE for n in range(16)}
    assert _translated(metadata=metadata).generation.messages


@pytest.mark.parametrize(
    ("metadata", "words"),
    [
        ({f"k{n}": "v" for n in range(MAX_METADATA_PAIRS + 1)}, "17 pairs"),
        ({"k" * (MAX_METADATA_KEY + 1): "v"}, "65 characters"),
        ({"k": "v" * (MAX_METADATA_VALUE + 1)}, "at most 512"),
        ({"k": 5}, "must be a string"),
        (["not", "an", "object"], "object of strings"),
    ],
)
def test_metadata_past_its_bounds_is_refused(metadata: Any, words: str) -> None:
    with pytest.raises(InvalidRequest, match=words) as refused:
        _translated(metadata=metadata)
    assert refused.value.param == "metadata"


def test_a_call_output_answers_a_call_made_in_the_input() -> None:
    output = {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}
    asked = translated_responses_request(
        {"input": [{"role": "user", "content": "Weather?"}, CALL, output]}, History()
    )
    assert asked.generation.messages[-1].tool_call_id == "call_1"


def test_a_call_output_for_an_unknown_call_id_is_refused() -> None:
    output = {"type": "function_call_output", "call_id": "call_9", "output": "sunny"}
    with pytest.raises(InvalidRequest, match="call_9") as refused:
        translated_responses_request(
            {"input": [{"role": "user", "content": "Weather?"}, CALL, output]}, History()
        )
    assert refused.value.param == "input"
