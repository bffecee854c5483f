"""For chat templates with no tool-call convention we know: the text is all content."""

from __future__ import annotations

from service.tools.base import CallShape, ParsedCalls


class PlainParser:
    name = "none"
    shape: CallShape | None = None  # no convention to force a call in

    def parse(self, text: str) -> ParsedCalls:
        return ParsedCalls(content=text)
