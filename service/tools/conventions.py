"""Which tool-call convention a model follows, read from its chat template.

A template that teaches a convention contains its markers (the way mlx-lm's
`_infer_tool_parser` picks its parsers), so no setting is needed: the first
entry of CONVENTIONS whose markers all appear in the template wins. Order
matters: FunctionGemma's template also has Gemma's turn markers.

A template with none of the markers that never reads `tools` teaches no
convention at all: the service then writes the tools into the prompt itself,
in its default convention (Hermes-style, service.tools.default_convention).
One that reads `tools` shows them its own way (Llama 3.1's, Mistral's), which
the server does not read: it keeps its template, and its output is all content.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from service.text.chat_template import template_variables
from service.text.requests import ChatMessage, Finished, FinishReason, Tool
from service.tools.base import ParsedCalls, ToolCallParser
from service.tools.default_convention import default_turns
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


@dataclass(frozen=True)
class Convention:
    """How a model is shown tools, and how its calls are read (and forced)."""

    parser: ToolCallParser
    # True: the template teaches none, and the service writes its default into the turns.
    default: bool = False

    def turns(
        self, messages: Sequence[ChatMessage], tools: Sequence[Tool]
    ) -> tuple[Sequence[ChatMessage], Sequence[Tool]]:
        """The messages and tools to render the template with."""
        if not self.default:
            return messages, tools
        return default_turns(messages, tools), ()


@lru_cache(maxsize=32)
def convention_for_template(template: str | None) -> Convention:
    """The convention of a model with this chat template (None: the model has none)."""
    if template is None:
        return Convention(PlainParser())
    for markers, parser in CONVENTIONS:
        if all(marker in template for marker in markers):
            return Convention(parser)
    if "tools" in template_variables(template):
        return Convention(PlainParser())  # its own way of showing tools, which we do not read
    return Convention(HermesParser(), default=True)


def parser_for_template(template: str | None) -> ToolCallParser:
    """The parser for a model with this chat template (None: the model has none)."""
    return convention_for_template(template).parser


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
