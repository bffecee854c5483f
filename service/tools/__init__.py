"""Tool calls in generated text: one parser per model family's convention.

    convention = convention_for_template(chat_template)  # from the template's markers
    messages, tools = convention.turns(messages, tools)   # what the template renders
    parsed = convention.parser.parse(full_generated_text) # ParsedCalls(content, calls, errors)
    finished = with_tool_calls(finished, parsed)          # onto the stream's last event

A template that teaches no convention gets the service's default, Hermes-style,
written into the turns (`default_convention`). To support another convention,
write a class with `name`, `shape` and `parse(text) -> ParsedCalls` (see
`base.ToolCallParser`), and add it with the template markers that identify it
to `CONVENTIONS` in `service.tools.conventions`.
"""

from __future__ import annotations

from service.tools.base import ParsedCalls, ToolCallParser, new_call_id
from service.tools.conventions import (
    CONVENTIONS,
    Convention,
    convention_for_template,
    parser_for_template,
    with_tool_calls,
)

__all__ = [
    "CONVENTIONS",
    "Convention",
    "ParsedCalls",
    "ToolCallParser",
    "convention_for_template",
    "new_call_id",
    "parser_for_template",
    "with_tool_calls",
]
