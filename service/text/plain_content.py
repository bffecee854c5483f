"""Message content is text: control tokens a client writes into it stay text.

A rendered chat template is tokenized with its special tokens parsed, so that
the template's own turn markers (`<|im_start|>`, `<start_of_turn>`) become
their ids. Done naively, the same happens to a marker a client writes inside
a message's content: one user message carrying `<|im_end|>` and a fake
assistant turn tokenized exactly like the real turns, and the model took the
forged answer as its own.

So the prompt is cut into the template's text and the clients' text (each
message's content, each tool call's arguments), and only the template's is
tokenized with special tokens parsed. Finding where the clients' text lies
in the rendered prompt is done by rendering again with each such piece
replaced by a marker; the markers' places are exact as long as the template
passes the pieces through unchanged, which is checked by putting the pieces
back and comparing with the real rendering. A template that rewrites a piece
holding control text (trims it, splits it) cannot be served that text:
INVALID_ARGUMENT. Content without control text (nearly all of it) costs one
scan and is tokenized in one piece, exactly as before.

Names and tool-call ids are identifiers: control text in them is refused.
"""

from __future__ import annotations

import dataclasses
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from service.errors import InvalidRequest, excerpt
from service.text.requests import ChatMessage

# Markers for the clients' pieces: private-use characters no tokenizer gives meaning.
_OPEN, _CLOSE = "\ue000", "\ue001"
_MARKER = re.compile(f"{_OPEN}(\\d+){_CLOSE}")


class ControlTexts:
    """Finds the text of any special token (the ones a tokenizer parses out of text)."""

    def __init__(self, texts: Iterable[str]) -> None:
        # By their first two characters, with the lengths to try: one dictionary look-up
        # per length at each place where a special token could start.
        self._texts = frozenset(text for text in texts if text)
        self._lengths: dict[str, list[int]] = defaultdict(list)
        for text in self._texts:
            self._lengths[text[:2]].append(len(text))
        for lengths in self._lengths.values():
            lengths.sort()
        starts = sorted({text[0] for text in self._texts})
        self._starts = re.compile("[" + "".join(re.escape(c) for c in starts) + "]")

    def first_in(self, text: str) -> str | None:
        """The first special token's text written in `text`, or None."""
        if not self._texts:
            return None
        for found in self._starts.finditer(text):
            at = found.start()
            for length in self._lengths.get(text[at : at + 2], ()):
                piece = text[at : at + length]
                if piece in self._texts:
                    return piece
        return None


@dataclass(frozen=True)
class Span:
    """Where in the rendered prompt one piece of a client's text lies."""

    start: int
    end: int


class Tokenize(Protocol):
    def __call__(self, text: str, *, add_bos: bool, special: bool) -> list[int]: ...


def prompt_ids(
    rendered: str,
    messages: Sequence[ChatMessage],
    render: Callable[[Sequence[ChatMessage]], str],
    control: ControlTexts,
    tokenize: Tokenize,
    *,
    add_bos: bool,
) -> list[int]:
    """The rendered chat prompt's ids: the template's markers as special tokens, what
    clients wrote as plain text."""
    ids: list[int] = []
    for piece, plain in cut(rendered, plain_spans(rendered, messages, render, control)):
        ids += tokenize(piece, add_bos=add_bos and not ids, special=not plain)
    return ids


def plain_spans(
    rendered: str,
    messages: Sequence[ChatMessage],
    render: Callable[[Sequence[ChatMessage]], str],
    control: ControlTexts,
) -> list[Span]:
    """The spans of `rendered` to tokenize as plain text; empty when no client text
    holds a special token's text (the prompt is then tokenized whole)."""
    _refuse_in_names(messages, control)
    pieces = _pieces(messages)
    if not any(control.first_in(text) for text in pieces):
        return []
    marked = render(_marked(messages))
    spans, rebuilt = _placed(marked, pieces)
    if rebuilt != rendered:
        found = next(control.first_in(text) for text in pieces if control.first_in(text))
        raise InvalidRequest(
            f"a message holds {excerpt(found or '')}, the text of a special token, and this "
            "model's chat template rewrites message text, so it cannot be kept as plain "
            "text: remove it from the message"
        )
    return spans


def cut(rendered: str, spans: Sequence[Span]) -> list[tuple[str, bool]]:
    """The prompt as (text, is_plain) pieces in order."""
    pieces: list[tuple[str, bool]] = []
    at = 0
    for span in spans:
        if span.start > at:
            pieces.append((rendered[at : span.start], False))
        pieces.append((rendered[span.start : span.end], True))
        at = span.end
    if at < len(rendered):
        pieces.append((rendered[at:], False))
    return [(text, plain) for text, plain in pieces if text]


def _pieces(messages: Sequence[ChatMessage]) -> list[str]:
    """The clients' text, in the order `_marked` numbers it."""
    pieces: list[str] = []
    for message in messages:
        pieces.append(message.content)
        pieces.extend(call.arguments_json for call in message.tool_calls)
    return pieces


def _marked(messages: Sequence[ChatMessage]) -> list[ChatMessage]:
    counter = iter(range(1 << 62))

    def mark(text: str) -> str:
        index = next(counter)
        return f"{_OPEN}{index}{_CLOSE}" if text else text

    marked = []
    for message in messages:
        content = mark(message.content)
        calls = tuple(
            dataclasses.replace(call, arguments_json=mark(call.arguments_json))
            for call in message.tool_calls
        )
        marked.append(dataclasses.replace(message, content=content, tool_calls=calls))
    return marked


def _placed(marked: str, pieces: Sequence[str]) -> tuple[list[Span], str]:
    """The pieces put back where their markers are, and where they then lie."""
    spans: list[Span] = []
    out: list[str] = []
    length = 0
    at = 0
    for found in _MARKER.finditer(marked):
        out.append(marked[at : found.start()])
        length += found.start() - at
        index = int(found[1])
        text = pieces[index] if index < len(pieces) else found[0]
        spans.append(Span(length, length + len(text)))
        out.append(text)
        length += len(text)
        at = found.end()
    out.append(marked[at:])
    return spans, "".join(out)


def _refuse_in_names(messages: Sequence[ChatMessage], control: ControlTexts) -> None:
    for index, message in enumerate(messages):
        names = [message.name, message.tool_call_id]
        for call in message.tool_calls:
            names += [call.name, call.id]
        for name in names:
            found = control.first_in(name)
            if found is not None:
                raise InvalidRequest(
                    f"messages[{index}]: a name or tool call id holds {excerpt(found)}, the text "
                    "of a special token; names and ids may not"
                )
