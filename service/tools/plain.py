"""For chat templates with no tool-call convention we know: the text is all content."""

from __future__ import annotations

from service.tools.base import ParsedCalls


class PlainParser:
    name = "none"

    def parse(self, text: str) -> ParsedCalls:
        return ParsedCalls(content=text)
