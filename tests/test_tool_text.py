"""What of a streamed answer with tools goes out before its end (tool_text)."""

from __future__ import annotations

import pytest

from service.front.openai_api.tool_text import ToolTextGate
from service.tools.conventions import parser_for_template

HERMES = parser_for_template("... <tool_call> ...")
GEMMA = parser_for_template("<start_of_turn>user ...")
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'


def stream(gate: ToolTextGate, text: str, size: int) -> list[str]:
    """The pieces that go out as `text` arrives `size` characters at a time."""
    pieces = [gate.add(text[at : at + size]) for at in range(0, len(text), size)]
    return [piece for piece in pieces if piece]


@pytest.mark.parametrize("size", [1, 3, 7, 200])
def test_text_before_a_call_goes_out_and_the_call_never_does(size: int) -> None:
    text = "  Let me look that up for you. \n" + CALL
    gate = ToolTextGate()
    pieces = stream(gate, text, size)
    sent = "".join(pieces)
    assert sent == "Let me look that up for you."
    assert size > 100 or len(pieces) > 1  # streamed, not in one piece at the end
    parsed = HERMES.parse(text)
    assert parsed.calls
    assert gate.remainder(parsed.content) == ""
    assert sent + gate.remainder(parsed.content) == parsed.content


@pytest.mark.parametrize("size", [1, 4, 200])
def test_an_answer_without_calls_goes_out_whole_over_the_stream(size: int) -> None:
    text = "\nIt is sunny in Rome,   and warm. "
    gate = ToolTextGate()
    sent = "".join(stream(gate, text, size))
    parsed = HERMES.parse(text)  # no calls: the content is the text as written
    assert sent == "It is sunny in Rome,   and warm."
    assert sent + gate.remainder(parsed.content) == parsed.content.lstrip()


def test_a_marker_split_over_deltas_is_held_until_it_is_one_or_not() -> None:
    gate = ToolTextGate()
    assert gate.add("Done <tool") == "Done"
    assert gate.add("_c") == ""
    assert gate.add("url, the first result") == " <tool_curl, the first result"
    gate = ToolTextGate()
    assert gate.add("Done <tool") == "Done"
    assert gate.add("_call>{") == ""
    assert gate.add("} more text") == ""  # everything after a marker waits for the parse


@pytest.mark.parametrize(
    "text", ['[get_weather(city="Rome")]', '{"name": "get_weather"}', "```tool_code\nx()\n```"]
)
def test_an_answer_that_starts_like_a_call_without_markers_is_held_whole(text: str) -> None:
    gate = ToolTextGate()
    assert stream(gate, "\n" + text, 2) == []
    parsed = GEMMA.parse("\n" + text)
    assert gate.remainder(parsed.content) == parsed.content


def test_text_after_a_call_comes_with_the_parse() -> None:
    text = "Checking. " + CALL + "\nBack soon."
    gate = ToolTextGate()
    sent = "".join(stream(gate, text, 5))
    parsed = HERMES.parse(text)
    assert sent == "Checking."
    assert sent + gate.remainder(parsed.content) == parsed.content
    assert "Back soon." in gate.remainder(parsed.content)
