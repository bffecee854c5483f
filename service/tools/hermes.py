"""Hermes-style calls: a JSON object inside <tool_call></tool_call> tags.

The convention of NousResearch's Hermes 2 Pro, adopted by the Qwen 2 / 2.5 /
3 chat templates (and other ChatML-family models): the template asks for
"a json object with function name and arguments within <tool_call></tool_call>
XML tags", i.e.

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

one block per call, several blocks for parallel calls. llama.cpp's
`common_chat_params_init_hermes_2_pro` and mlx-lm's `json_tools` parser read
the same format.
"""

from __future__ import annotations

import json

from service.text.requests import ToolCall
from service.tools.base import (
    JSON_ERRORS,
    CallShape,
    ParsedCalls,
    assemble,
    find_blocks,
    make_call,
)

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class HermesParser:
    name = "hermes"
    # As Qwen 2.5's template shows a call: the block on lines of its own.
    shape = CallShape(
        opening=f'{OPEN}\n{{"name": "',
        between='", "arguments": ',
        closing=f"}}\n{CLOSE}",
        separator="\n",
    )

    def parse(self, text: str) -> ParsedCalls:
        pieces: list[tuple[int, int, ToolCall | str]] = []
        for number, (start, end, body) in enumerate(find_blocks(text, OPEN, CLOSE), 1):
            pieces.append((start, end, _call(body, number)))
        return assemble(text, pieces)


def _call(body: str, number: int) -> ToolCall | str:
    """The call in one block's body, or why it is not one."""
    try:
        value = json.loads(body)
    except JSON_ERRORS as exc:
        return f"tool call {number}: not valid JSON ({exc}): {body.strip()[:200]!r}"
    if not isinstance(value, dict):
        return f"tool call {number}: expected a JSON object, got {type(value).__name__}"
    name = value.get("name")
    if not isinstance(name, str) or not name:
        return f"tool call {number}: no function name"
    # Some models write "parameters", or the arguments as a JSON string.
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except JSON_ERRORS as exc:
            return f"tool call {number} ({name}): arguments are not valid JSON ({exc})"
    if not isinstance(arguments, dict):
        return f"tool call {number} ({name}): arguments must be a JSON object"
    return make_call(name, arguments, number)
