"""What every tool-call parser returns, and the Protocol a parser meets."""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any, Protocol

from service.text.requests import MAX_JSON_DEPTH, ToolCall, json_depth

# What json.loads raises on text a model wrote, which can be anything: a syntax
# error, an integer of 4,300 digits and more (ValueError), nesting without end.
JSON_ERRORS = (ValueError, RecursionError)


@dataclass(frozen=True)
class ParsedCalls:
    """A generated text split into what a person reads and the calls it made.

    `content` is the text without the well-formed call blocks; a block that
    could not be parsed stays in `content` and is described in `errors`.
    """

    content: str
    calls: tuple[ToolCall, ...] = ()
    errors: tuple[str, ...] = ()


@dataclass(frozen=True)
class CallShape:
    """How a convention writes one call, for the grammar that forces one.

    A call is `opening`, the function's name, `between`, its arguments as a
    JSON object, then `closing`; `separator` goes between the calls of one
    turn (None: the convention writes one call per turn).
    """

    opening: str
    between: str
    closing: str
    separator: str | None


class ToolCallParser(Protocol):
    """One model family's convention for writing tool calls in its output."""

    @property
    def name(self) -> str: ...

    @property
    def shape(self) -> CallShape | None:
        """How to write a call so that `parse` reads it; None: calls cannot be forced."""
        ...

    def parse(self, text: str) -> ParsedCalls:
        """Never raises on model output: what cannot be parsed becomes an error entry."""
        ...


def new_call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


def make_call(name: str, arguments: dict[str, Any], number: int) -> ToolCall | str:
    """Call `number` of a reply, or why its arguments cannot be sent as JSON: a model
    can write a set or bytes in Python's form, or NaN, which strict JSON lacks."""
    if json_depth(arguments) > MAX_JSON_DEPTH:  # a request could not send them back
        return f"tool call {number} ({name}): arguments nested deeper than {MAX_JSON_DEPTH} levels"
    try:
        text = json.dumps(arguments, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        return f"tool call {number} ({name}): arguments are not JSON ({exc})"
    return ToolCall(id=new_call_id(), name=name, arguments_json=text)


def assemble(text: str, pieces: list[tuple[int, int, ToolCall | str]]) -> ParsedCalls:
    """ParsedCalls from blocks found at text[start:end], each a call or an error message.

    Well-formed blocks are cut out of the content; malformed ones stay in it.
    """
    calls = [piece for _, _, piece in pieces if isinstance(piece, ToolCall)]
    errors = [piece for _, _, piece in pieces if isinstance(piece, str)]
    if not calls:
        return ParsedCalls(content=text, errors=tuple(errors))
    kept: list[str] = []
    position = 0
    for start, end, piece in pieces:
        if isinstance(piece, ToolCall):
            kept.append(text[position:start])
            position = end
    kept.append(text[position:])
    return ParsedCalls(content="".join(kept).strip(), calls=tuple(calls), errors=tuple(errors))


def find_blocks(text: str, open_tag: str, close_tag: str) -> list[tuple[int, int, str]]:
    """(start, end, body) of each open_tag...close_tag block.

    The last block may lack its close tag: generation often stops on it (a
    stop sequence or end of turn), so a block running to the end of the text
    still counts.
    """
    blocks: list[tuple[int, int, str]] = []
    position = 0
    while (start := text.find(open_tag, position)) >= 0:
        body_start = start + len(open_tag)
        close = text.find(close_tag, body_start)
        end = len(text) if close < 0 else close + len(close_tag)
        body = text[body_start : len(text) if close < 0 else close]
        blocks.append((start, end, body))
        position = end
    return blocks
