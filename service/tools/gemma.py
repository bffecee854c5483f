"""Gemma 3 calls: prompted, not templated; a Python-style call list or a JSON object.

Gemma 3's chat template has no tool support, and Google's "Function calling
with Gemma" guide (ai.google.dev/gemma/docs/capabilities/function-calling)
says "Gemma does not output a tool specific token": the framework prompts for
a format and detects it. The guide's two recommended formats are

    [func_name1(params_name1=params_value1, params_name2=params_value2), func_name2(params)]
    {"name": function name, "parameters": dictionary of argument name and its value}

each as the whole response ("You SHOULD NOT include any other text in the
response if you call a function"). Models also wrap them in a Markdown fence
(```tool_code, as in Google's Gemma 3 launch examples, or ```python/```json),
which is accepted. A response that does not start like either format is an
ordinary answer, not an error.

Python-style values are read with `ast.literal_eval`, never executed; calls
must name their arguments, since the parser does not know the schemas'
parameter order.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from service.text.requests import ToolCall
from service.tools.base import JSON_ERRORS, CallShape, ParsedCalls, make_call

_FENCE = re.compile(r"\A```[A-Za-z_]*[ \t]*\n(?P<body>.*?)\n?```\Z", re.DOTALL)
_LOOKS_PYTHONIC = re.compile(r"\A\[?\s*[A-Za-z_][\w.]*\s*\(")


class GemmaParser:
    name = "gemma"
    # The guide's JSON form: one call, the whole response.
    shape = CallShape(
        opening='{"name": "', between='", "parameters": ', closing="}", separator=None
    )

    def parse(self, text: str) -> ParsedCalls:
        body = text.strip()
        if fence := _FENCE.match(body):
            body = fence.group("body").strip()
        if body.startswith("{"):
            return _json_call(text, body)
        if _LOOKS_PYTHONIC.match(body):
            return _pythonic_calls(text, body)
        return ParsedCalls(content=text)


def _json_call(text: str, body: str) -> ParsedCalls:
    try:
        value = json.loads(body)
    except JSON_ERRORS:
        return ParsedCalls(content=text)  # JSON-like prose, or an answer in JSON
    if not isinstance(value, dict) or "name" not in value:
        return ParsedCalls(content=text)
    name = value["name"]
    arguments = value.get("parameters", value.get("arguments", {}))
    if not isinstance(name, str) or not name or not isinstance(arguments, dict):
        return ParsedCalls(
            content=text,
            errors=("tool call 1: needs a string name and an object of parameters",),
        )
    call = make_call(name, arguments, 1)
    if isinstance(call, str):
        return ParsedCalls(content=text, errors=(call,))
    return ParsedCalls(content="", calls=(call,))


def _pythonic_calls(text: str, body: str) -> ParsedCalls:
    try:
        tree = ast.parse(body, mode="eval").body
    except SyntaxError as exc:
        return ParsedCalls(content=text, errors=(f"tool call: not a Python call list ({exc.msg})",))
    except (ValueError, MemoryError, RecursionError) as exc:  # a NUL; nesting past the parser
        return ParsedCalls(content=text, errors=(f"tool call: not a Python call list ({exc!r})",))
    nodes = tree.elts if isinstance(tree, ast.List) else [tree]
    calls: list[ToolCall] = []
    errors: list[str] = []
    for number, node in enumerate(nodes, 1):
        call = _call(node, number)
        if isinstance(call, str):
            errors.append(call)
        else:
            calls.append(call)
    if not calls:
        return ParsedCalls(content=text, errors=tuple(errors))
    return ParsedCalls(content="", calls=tuple(calls), errors=tuple(errors))


def _call(node: ast.expr, number: int) -> ToolCall | str:
    if not isinstance(node, ast.Call):
        return f"tool call {number}: not a function call"
    name = _dotted_name(node.func)
    if name is None:
        return f"tool call {number}: the function is not a plain name"
    if node.args:
        return f"tool call {number} ({name}): arguments must be named (key=value)"
    arguments: dict[str, Any] = {}
    for keyword in node.keywords:
        if keyword.arg is None:
            return f"tool call {number} ({name}): **kwargs is not supported"
        try:
            arguments[keyword.arg] = ast.literal_eval(keyword.value)
        except (ValueError, TypeError, MemoryError, RecursionError):  # TypeError: {[1]: 2}
            return f"tool call {number} ({name}): {keyword.arg} is not a literal value"
    return make_call(name, arguments, number)


def _dotted_name(node: ast.expr) -> str | None:
    """`get_weather`, or the last part of `default_api.get_weather`."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None
