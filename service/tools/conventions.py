"""Which tool-call convention a model follows, read from its chat template.

A template that teaches a convention contains its markers (the way mlx-lm's
`_infer_tool_parser` picks its parsers), so no setting is needed: the first
entry of CONVENTIONS whose markers all appear in the template wins. Order
matters: FunctionGemma's template also has Gemma's turn markers.
"""

from __future__ import annotations

import dataclasses

from service.text.requests import Finished, FinishReason
from service.tools.base import ParsedCalls, ToolCallParser
from service.tools.function_gemma import FunctionGemmaParser
from service.tools.gemma import GemmaParser
from service.tools.hermes import HermesParser
from service.tools.plain import PlainParser

CONVENTIONS: tuple[tuple[tuple[str, ...], ToolCallParser], ...] = (
    (("<start_function_call>",), FunctionGemmaParser()),
    (("<tool_call>",), HermesParser()),
    (("<start_of_turn>",), GemmaParser()),
)

# Reasons that mean the model ended its turn by itself; a call cut off by a
# length or time limit keeps the reason that says so.
_NATURAL_ENDS = (FinishReason.END_OF_TURN, FinishReason.STOP_SEQUENCE)


def parser_for_template(template: str | None) -> ToolCallParser:
    """The parser for a model with this chat template (None: the model has none)."""
    for markers, parser in CONVENTIONS:
        if template is not None and all(marker in template for marker in markers):
            return parser
    return PlainParser()


def with_tool_calls(finished: Finished, parsed: ParsedCalls) -> Finished:
    """The Finished event of a request with tools, carrying what the parser found."""
    reason = finished.finish_reason
    if parsed.calls and reason in _NATURAL_ENDS:
        reason = FinishReason.TOOL_CALL
    return dataclasses.replace(
        finished,
        finish_reason=reason,
        tool_calls=parsed.calls,
        content=parsed.content,
        tool_call_errors=parsed.errors,
    )
