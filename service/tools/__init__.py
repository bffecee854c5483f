"""Tool calls in generated text: one parser per model family's convention.

    parser = parser_for_template(chat_template)   # chosen from the template's markers
    parsed = parser.parse(full_generated_text)     # ParsedCalls(content, calls, errors)
    finished = with_tool_calls(finished, parsed)   # onto the stream's last event

To support another convention, write a class with `name` and
`parse(text) -> ParsedCalls` (see `base.ToolCallParser`), and add it with the
template markers that identify it to `CONVENTIONS` in `service.tools.conventions`.
"""

from __future__ import annotations

from service.tools.base import ParsedCalls, ToolCallParser, new_call_id
from service.tools.conventions import CONVENTIONS, parser_for_template, with_tool_calls

__all__ = [
    "CONVENTIONS",
    "ParsedCalls",
    "ToolCallParser",
    "new_call_id",
    "parser_for_template",
    "with_tool_calls",
]
