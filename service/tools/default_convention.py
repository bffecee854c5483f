"""The tool-call convention the service writes for a chat template that teaches none.

A template that never reads `tools` (SmolLM2's ChatML, and most templates of
models not tuned for tools) drops the tools a request offers, and shows a
conversation's calls as empty assistant turns. For such a template the service
writes the tools, the calls and their results into the turns it hands the
template, in the Hermes convention (service.tools.hermes), the one most open
models are trained on, in the words of Qwen 2.5's template:

- the tools, and how to call one, at the end of the system turn (after the
  client's own system text, or as a system turn of their own ahead of the
  conversation), each tool's signature as one line of JSON between `<tools>`
  tags;
- an assistant turn's calls as `<tool_call>` blocks after its text;
- tool results as `<tool_response>` blocks in a user turn, one turn for each
  run of consecutive results (every template renders a user turn; not every
  one renders a `tool` turn).

The Hermes parser then reads the answer, and a forced call is written in its
shape. What the client wrote (message text, call arguments) is passed through
unchanged, so service.text.plain_content still finds it in the rendered prompt.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

from service.text.chat_template import tool_signature
from service.text.requests import ChatMessage, Tool, ToolCall
from service.tools.hermes import CLOSE, OPEN

TOOLS_OPENING = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
TOOLS_CLOSING = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


def default_turns(messages: Sequence[ChatMessage], tools: Sequence[Tool]) -> list[ChatMessage]:
    """`messages` with `tools`, calls and results written in as text; a conversation
    without any of them is returned as it is."""
    turns = _with_calls_and_results(messages)
    if not tools:
        return turns
    described = tools_text(tools)
    if turns and turns[0].role == "system":
        first = turns[0]
        content = f"{first.content}\n\n{described}" if first.content else described
        return [dataclasses.replace(first, content=content), *turns[1:]]
    return [ChatMessage("system", described), *turns]


def tools_text(tools: Sequence[Tool]) -> str:
    """What the system turn says of `tools`: each as transformers hands it to a template,
    on a line of its own, as Qwen 2.5's template shows them."""
    lines = (json.dumps(tool_signature(tool), ensure_ascii=False) for tool in tools)
    return TOOLS_OPENING + "\n".join(lines) + TOOLS_CLOSING


def _with_calls_and_results(messages: Sequence[ChatMessage]) -> list[ChatMessage]:
    turns: list[ChatMessage] = []
    results: list[str] = []  # a run of tool results not yet written
    for message in messages:
        if message.role == "tool":
            results.append(f"<tool_response>\n{message.content}\n</tool_response>")
            continue
        if results:
            turns.append(ChatMessage("user", "\n".join(results)))
            results = []
        if message.tool_calls:
            blocks = [_block(call) for call in message.tool_calls]
            text = "\n".join([message.content, *blocks] if message.content else blocks)
            turns.append(dataclasses.replace(message, content=text, tool_calls=()))
        else:
            turns.append(message)
    if results:
        turns.append(ChatMessage("user", "\n".join(results)))
    return turns


def _block(call: ToolCall) -> str:
    """One call as the Hermes parser reads it; the arguments as the client sent them
    (a JSON object, checked when the request was)."""
    name = json.dumps(call.name, ensure_ascii=False)
    return f'{OPEN}\n{{"name": {name}, "arguments": {call.arguments_json or "{}"}}}\n{CLOSE}'
