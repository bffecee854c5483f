"""FunctionGemma calls: <start_function_call>call:NAME{key:value,...}<end_function_call>.

From Google's FunctionGemma documentation ("FunctionGemma formatting and best
practices", ai.google.dev/gemma/docs/functiongemma) and the chat template of
google/functiongemma-270m-it: the model writes

    <start_function_call>call:get_weather{location:<escape>Tokyo, Japan<escape>}<end_function_call>

Keys are bare identifiers; every string value is wrapped in the <escape>
token instead of quotes, so strings may hold any character; numbers, booleans
and null are written raw; objects use the same key:value form in braces and
arrays square brackets (the template writes tool declarations this way, and
llama.cpp's `common_chat_params_init_function_gemma` also accepts raw JSON
values, so quoted JSON strings and keys are read too). Parallel calls are
consecutive blocks. `<end_function_call>` is often a stop sequence, so a
block cut off there is read to the end of the text.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from service.text.requests import MAX_JSON_DEPTH, ToolCall
from service.tools.base import (
    JSON_ERRORS,
    CallShape,
    ParsedCalls,
    assemble,
    find_blocks,
    make_call,
)

OPEN, CLOSE = "<start_function_call>", "<end_function_call>"
ESCAPE = "<escape>"
_DELIMITERS = ",}]"
_json = json.JSONDecoder()


class MalformedCall(ValueError):
    pass


class FunctionGemmaParser:
    name = "function_gemma"
    # A forced call's arguments are plain JSON (quoted keys and strings), which
    # `parse` reads as well as the <escape> form: a JSON Schema grammar writes JSON.
    shape = CallShape(opening=f"{OPEN}call:", between="", closing=CLOSE, separator="")

    def parse(self, text: str) -> ParsedCalls:
        pieces: list[tuple[int, int, ToolCall | str]] = []
        for number, (start, end, body) in enumerate(find_blocks(text, OPEN, CLOSE), 1):
            try:
                name, arguments = _Reader(body.strip()).call()
            except MalformedCall as exc:
                pieces.append((start, end, f"tool call {number}: {exc}: {body.strip()[:200]!r}"))
            else:
                pieces.append((start, end, make_call(name, arguments, number)))
        return assemble(text, pieces)


class _Reader:
    """A recursive-descent reader of one call's body."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.position = 0
        self.depth = 0

    def call(self) -> tuple[str, dict[str, Any]]:
        if not self.text.startswith("call:"):
            raise MalformedCall("expected 'call:NAME{...}'")
        self.position = len("call:")
        brace = self.text.find("{", self.position)
        if brace < 0:
            raise MalformedCall("no '{' after the function name")
        name = self.text[self.position : brace].strip()
        if not name.replace("_", "").replace("-", "").isalnum():
            raise MalformedCall(f"bad function name {name!r}")
        self.position = brace
        arguments = self.object()
        if self.text[self.position :].strip():
            raise MalformedCall("text after the arguments")
        return name, arguments

    def object(self) -> dict[str, Any]:
        self.expect("{")
        members: dict[str, Any] = {}
        if self.peek() == "}":
            self.position += 1
            return members
        while True:
            key = self.key()
            self.expect(":")
            members[key] = self.value()
            if self.take(",") is None:
                self.expect("}")
                return members

    def array(self) -> list[Any]:
        self.expect("[")
        items: list[Any] = []
        if self.peek() == "]":
            self.position += 1
            return items
        while True:
            items.append(self.value())
            if self.take(",") is None:
                self.expect("]")
                return items

    def nested(self, read: Callable[[], Any]) -> Any:
        """An object or array inside the arguments; a model may nest them without end."""
        self.depth += 1
        if self.depth > MAX_JSON_DEPTH:
            raise MalformedCall(f"arguments nested deeper than {MAX_JSON_DEPTH} levels")
        value = read()
        self.depth -= 1
        return value

    def key(self) -> str:
        self.skip_space()
        if self.text.startswith(ESCAPE, self.position):
            return self.escaped()
        if self.peek() == '"':
            return str(self.raw_json())
        colon = self.text.find(":", self.position)
        if colon < 0:
            raise MalformedCall("an argument without ':'")
        key = self.text[self.position : colon].strip()
        if not key:
            raise MalformedCall("an argument without a name")
        self.position = colon
        return key

    def value(self) -> Any:
        self.skip_space()
        if self.text.startswith(ESCAPE, self.position):
            return self.escaped()
        char = self.peek()
        if char in ("{", "["):
            return self.nested(self.object if char == "{" else self.array)
        if char == '"':
            return self.raw_json()
        end = self.position
        while end < len(self.text) and self.text[end] not in _DELIMITERS:
            end += 1
        raw = self.text[self.position : end].strip()
        try:
            value = json.loads(raw)
        except JSON_ERRORS:
            raise MalformedCall(f"unquoted value {raw!r} (strings need <escape>)") from None
        self.position = end
        return value

    def escaped(self) -> str:
        start = self.position + len(ESCAPE)
        end = self.text.find(ESCAPE, start)
        if end < 0:
            raise MalformedCall("a string without its closing <escape>")
        self.position = end + len(ESCAPE)
        return self.text[start:end]

    def raw_json(self) -> Any:
        try:
            value, self.position = _json.raw_decode(self.text, self.position)
        except JSON_ERRORS as exc:
            raise MalformedCall(f"bad JSON value ({exc})") from None
        return value

    def skip_space(self) -> None:
        while self.position < len(self.text) and self.text[self.position].isspace():
            self.position += 1

    def peek(self) -> str:
        self.skip_space()
        return self.text[self.position : self.position + 1]

    def take(self, char: str) -> str | None:
        if self.peek() == char:
            self.position += 1
            return char
        return None

    def expect(self, char: str) -> None:
        if self.take(char) is None:
            found = self.text[self.position : self.position + 10] or "the end"
            raise MalformedCall(f"expected {char!r} at {found!r}")
