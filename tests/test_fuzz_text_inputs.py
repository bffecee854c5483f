"""Seeded random input for the code that reads what clients and models write.

Two readers take text no one vouches for: the OpenAI-compatible surface turns
any JSON body into a GenerateRequest, and the tool-call parsers read whatever a
model wrote. Both must answer with a refusal (ServiceError) or a result, never
an exception of another kind: those became HTTP 500s, and one in a parser ended
every stream of its model. The cases are seeded, so a failure repeats.
"""

from __future__ import annotations

import json
import math
import random
from typing import Any

import pytest

from service.errors import ServiceError
from service.front.openai_api.requests import chat_request, completion_request
from service.front.openai_api.tool_text import ToolTextGate
from service.tools.function_gemma import FunctionGemmaParser
from service.tools.gemma import GemmaParser
from service.tools.hermes import HermesParser

SEED = 28
BODIES = 3000
OUTPUTS = 3000

# The names the surface reads, so random bodies reach past the first check.
FIELDS = (
    "model", "messages", "role", "content", "type", "text", "tool_calls", "function", "name",
    "arguments", "id", "tool_call_id", "tools", "parameters", "description", "tool_choice",
    "response_format", "json_schema", "schema", "stream", "stream_options", "include_usage",
    "max_tokens", "max_completion_tokens", "temperature", "top_p", "stop", "seed", "n",
    "logprobs", "top_logprobs", "prompt", "echo", "suffix", "best_of", "top_k", "min_p",
    "repeat_penalty", "grammar", "parallel_tool_calls", "user", "frequency_penalty",
    "presence_penalty",
)  # fmt: skip
SCALARS: tuple[Any, ...] = (None, True, 0, -1, 1.5, math.nan, 10**30, "", "x", "auto", "text")


def random_json(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(10 if depth < 3 else 6)
    if kind < 6:
        return rng.choice(SCALARS)
    if kind < 8:
        return [random_json(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(FIELDS): random_json(rng, depth + 1) for _ in range(rng.randrange(5))}


def random_body(rng: random.Random) -> dict[str, Any]:
    body = {rng.choice(FIELDS): random_json(rng) for _ in range(rng.randrange(7))}
    user = {"role": "user", "content": "hi"}
    if rng.random() < 0.5:  # a valid conversation, so the other fields are read
        body["messages"] = [user]
    if rng.random() < 0.3:
        body["messages"] = [{"role": "assistant", "tool_calls": random_json(rng)}, user]
    if rng.random() < 0.3:
        body["response_format"] = {
            "type": rng.choice(["json_schema", "json_object", "text"]),
            "json_schema": random_json(rng),
        }
    if rng.random() < 0.3:
        body["prompt"] = "hi"
    return body


@pytest.mark.parametrize("translate", [chat_request, completion_request])
def test_any_json_body_is_translated_or_refused(translate: Any) -> None:
    rng = random.Random(SEED)
    for _ in range(BODIES):
        body = random_body(rng)
        try:
            translate(body)
        except ServiceError:
            pass
        except Exception as exc:
            pytest.fail(f"{type(exc).__name__}: {exc} on {json.dumps(body)[:300]}")


# Pieces of the three call conventions and of JSON and Python values, so random
# text often looks like a call and is half right.
PIECES = (
    "<tool_call>", "</tool_call>", "<start_function_call>", "<end_function_call>", "call:",
    "<escape>", "{", "}", "[", "]", "(", ")", '"', "'", ":", ",", "=", "name", "arguments",
    "parameters", "f", "x", "1", "-", ".", "e", "9" * 30, "NaN", "Infinity", "true", "null",
    " ", "\n", "```", "tool_code", "\\", "b", "j", "...", "**", "\x00", "é",
    '{"name": "f", "arguments": ', "[f(", "default_api.",
)  # fmt: skip
# Values a model may write as an argument, valid in one language or none.
VALUES = (
    "1", '"s"', "[1, [2]]", '{"a": 1}', "{'a': 1}", "{1, 2}", "b'x'", "1j", "...", "1e999",
    "NaN", "-Infinity", "{[1]: 2}", "1" * 5000, "[" * 300 + "]" * 300, "-" * 300 + "1",
    "<escape>s<escape>", "None", "True",
)  # fmt: skip
# A call in each convention, around one value.
SHAPES = (
    "[f(x={})]",
    "```tool_code\nf(x={})\n```",
    '<tool_call>{{"name": "f", "arguments": {{"x": {}}}}}</tool_call>',
    "<start_function_call>call:f{{x:{}}}<end_function_call>",
    '{{"name": "f", "parameters": {{"x": {}}}}}',
)


def random_output(rng: random.Random) -> str:
    if rng.random() < 0.3:
        return "".join(rng.choice(PIECES) for _ in range(rng.randrange(1, 40)))
    value = rng.choice(VALUES)
    if rng.random() < 0.3:  # a value broken by a stray piece
        value += rng.choice(PIECES)
    return rng.choice(SHAPES).format(value)


def test_any_model_output_parses_to_calls_with_strict_json_or_to_errors() -> None:
    rng = random.Random(SEED)
    parsers = (HermesParser(), FunctionGemmaParser(), GemmaParser())
    for _ in range(OUTPUTS):
        text = random_output(rng)
        for parser in parsers:
            parsed = parser.parse(text)
            for call in parsed.calls:  # strict: NaN and Infinity would fail here
                json.loads(call.arguments_json, parse_constant=_refuse_constant)
        gate = ToolTextGate()
        sent = "".join(gate.add(text[at : at + 3]) for at in range(0, len(text), 3))
        assert text.lstrip().startswith(sent)  # what goes out early is the answer's start


def _refuse_constant(name: str) -> None:
    raise AssertionError(f"{name} in arguments_json")
