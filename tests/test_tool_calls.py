"""Tool calls parsed out of model-style outputs, one convention at a time."""

from __future__ import annotations

import json

import pytest

from service.text.requests import Finished, FinishReason, Timing, Usage
from service.tools import ParsedCalls, parser_for_template, with_tool_calls
from service.tools.function_gemma import FunctionGemmaParser
from service.tools.gemma import GemmaParser
from service.tools.hermes import HermesParser


def arguments(parsed: ParsedCalls) -> list[tuple[str, object]]:
    return [(call.name, json.loads(call.arguments_json)) for call in parsed.calls]


# --- Hermes / Qwen ----------------------------------------------------------

# What Qwen2.5-Instruct writes for a parallel call (its template's format).
QWEN_PARALLEL = """I'll look both up.
<tool_call>
{"name": "get_weather", "arguments": {"city": "Tokyo"}}
</tool_call>
<tool_call>
{"name": "get_stock_price", "arguments": {"symbol": "GOOG", "exchange": null}}
</tool_call>"""


def test_hermes_reads_parallel_calls_and_keeps_the_prose() -> None:
    parsed = HermesParser().parse(QWEN_PARALLEL)
    assert arguments(parsed) == [
        ("get_weather", {"city": "Tokyo"}),
        ("get_stock_price", {"symbol": "GOOG", "exchange": None}),
    ]
    assert parsed.content == "I'll look both up."
    assert parsed.errors == ()
    ids = [call.id for call in parsed.calls]
    assert all(id_.startswith("call_") for id_ in ids)
    assert len(set(ids)) == 2


def test_hermes_reads_a_block_cut_off_at_its_closing_tag() -> None:
    parsed = HermesParser().parse('<tool_call>\n{"name": "now", "arguments": {}}\n')
    assert arguments(parsed) == [("now", {})]
    assert parsed.content == ""


def test_hermes_accepts_arguments_written_as_a_json_string() -> None:
    text = '<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>'
    assert arguments(HermesParser().parse(text)) == [("f", {"x": 1})]


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ('{"name": "get_weather", "arguments": {"city": "Tokyo"}', "not valid JSON"),
        ('{"arguments": {"city": "Tokyo"}}', "no function name"),
        ('{"name": "f", "arguments": [1, 2]}', "must be a JSON object"),
        ('["f"]', "expected a JSON object"),
    ],
)
def test_hermes_turns_a_malformed_block_into_an_error_not_an_exception(
    block: str, message: str
) -> None:
    text = f"Sure.\n<tool_call>\n{block}\n</tool_call>"
    parsed = HermesParser().parse(text)
    assert parsed.calls == ()
    assert len(parsed.errors) == 1
    assert message in parsed.errors[0]
    assert parsed.content == text


HUGE_NUMBER = "1" * 5000  # past Python's 4,300 digits for an int read from text
ENDLESS = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize(
    "text",
    [
        f'<tool_call>{{"name": "f", "arguments": {{"n": {HUGE_NUMBER}}}}}</tool_call>',
        f'<tool_call>{{"name": "f", "arguments": "{{\\"n\\": {HUGE_NUMBER}}}"}}</tool_call>',
        f'<tool_call>{{"name": "f", "arguments": {{"n": {ENDLESS}}}}}</tool_call>',
        f"<start_function_call>call:f{{n:{HUGE_NUMBER}}}<end_function_call>",
        f'<start_function_call>call:f{{n:{{"m": {HUGE_NUMBER}}}}}<end_function_call>',
        f"<start_function_call>call:f{{n:{ENDLESS}}}<end_function_call>",
        f'{{"name": "f", "parameters": {{"n": {HUGE_NUMBER}}}}}',
        f'{{"name": "f", "parameters": {ENDLESS}}}',
        '<tool_call>{"name": "f", "arguments": {"n": NaN}}</tool_call>',  # not strict JSON
        '{"name": "f", "parameters": {"n": Infinity}}',
        "[f(x={1, 2})]",  # Python values JSON has no form for
        "[f(x=b'ab')]",
        "[f(x=1j)]",
        "[f(x=...)]",
        "[f(x=1e999)]",
        "[f(x={[1]: 2})]",
        "[f(x=" + "-" * 100_000 + "1)]",  # past Python's own parser
        "[f(x=\0)]",
        '<tool_call>{"name": "f", "arguments": ' + '{"a": ' * 70 + "1" + "}" * 71 + "</tool_call>",
    ],
    ids=lambda text: f"{text[:24]}...{len(text)}",
)
def test_json_no_parser_can_read_is_no_call_and_no_exception(text: str) -> None:
    """A model writes what it likes: a number too long for Python, nesting without end."""
    for parser in (HermesParser(), FunctionGemmaParser(), GemmaParser()):
        parsed = parser.parse(text)
        assert parsed.calls == ()
        assert parsed.content == text or parsed.errors


def test_hermes_keeps_a_bad_block_beside_a_good_one() -> None:
    text = (
        '<tool_call>{"name": "a", "arguments": {}}</tool_call>'
        '<tool_call>{"name": "b", "arguments": {</tool_call>'
    )
    parsed = HermesParser().parse(text)
    assert arguments(parsed) == [("a", {})]
    assert parsed.content == '<tool_call>{"name": "b", "arguments": {</tool_call>'
    assert len(parsed.errors) == 1


def test_text_without_calls_is_left_exactly_as_it_was() -> None:
    for parser in (HermesParser(), FunctionGemmaParser(), GemmaParser()):
        parsed = parser.parse("  The answer is 4.\n")
        assert parsed == ParsedCalls(content="  The answer is 4.\n")


# --- FunctionGemma ----------------------------------------------------------

# From Google's FunctionGemma guide, and a parallel call with raw values.
FUNCTIONGEMMA_SINGLE = (
    "<start_function_call>call:get_current_weather{location:<escape>Tokyo, Japan<escape>}"
    "<end_function_call>"
)
FUNCTIONGEMMA_PARALLEL = (
    "<start_function_call>call:get_current_temperature{location:<escape>Paris<escape>,"
    "unit:<escape>celsius<escape>}<end_function_call>"
    "<start_function_call>call:roll_die{sides:20,verbose:false,seed:null}<end_function_call>"
)


def test_function_gemma_reads_escaped_strings_and_raw_values() -> None:
    assert arguments(FunctionGemmaParser().parse(FUNCTIONGEMMA_SINGLE)) == [
        ("get_current_weather", {"location": "Tokyo, Japan"})
    ]
    parsed = FunctionGemmaParser().parse(FUNCTIONGEMMA_PARALLEL)
    assert arguments(parsed) == [
        ("get_current_temperature", {"location": "Paris", "unit": "celsius"}),
        ("roll_die", {"sides": 20, "verbose": False, "seed": None}),
    ]
    assert parsed.content == ""


def test_function_gemma_reads_nested_values_and_special_characters() -> None:
    text = (
        "<start_function_call>call:send{to:[<escape>a@b.c<escape>,<escape>d@e.f<escape>],"
        'body:<escape>Hi {all}, "quoted": yes<escape>,options:{urgent:true,"retries":2},'
        "empty:{}}"
    )  # cut off at <end_function_call>, a stop sequence
    assert arguments(FunctionGemmaParser().parse(text)) == [
        (
            "send",
            {
                "to": ["a@b.c", "d@e.f"],
                "body": 'Hi {all}, "quoted": yes',
                "options": {"urgent": True, "retries": 2},
                "empty": {},
            },
        )
    ]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("call:get_weather{location:Tokyo}", "unquoted value"),
        ("call:get_weather{location:<escape>Tokyo}", "closing <escape>"),
        ("get_weather{location:<escape>Tokyo<escape>}", "expected 'call:"),
        ("call:get_weather{location:<escape>Tokyo<escape>", "expected '}'"),
        ("call:get weather{}", "bad function name"),
    ],
)
def test_function_gemma_turns_a_malformed_call_into_an_error(body: str, message: str) -> None:
    text = f"<start_function_call>{body}<end_function_call>"
    parsed = FunctionGemmaParser().parse(text)
    assert parsed.calls == ()
    assert len(parsed.errors) == 1
    assert message in parsed.errors[0]
    assert parsed.content == text


# --- Gemma 3 (prompted) -----------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        '[get_weather(city="Tokyo", days=3), get_time(zone="Asia/Tokyo")]',
        '```tool_code\nget_weather(city="Tokyo", days=3)\n```',
        '```python\n[default_api.get_weather(city="Tokyo", days=3)]\n```\n',
    ],
)
def test_gemma_reads_python_style_calls(text: str) -> None:
    parsed = GemmaParser().parse(text)
    assert arguments(parsed)[0] == ("get_weather", {"city": "Tokyo", "days": 3})
    assert parsed.content == ""


def test_gemma_reads_the_json_format_of_googles_guide() -> None:
    text = '{"name": "get_weather", "parameters": {"city": "Tokyo"}}'
    assert arguments(GemmaParser().parse(text)) == [("get_weather", {"city": "Tokyo"})]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[get_weather("Tokyo")]', "must be named"),
        ("[get_weather(city=lookup())]", "not a literal"),
        ('[get_weather(city="Tokyo"', "not a Python call list"),
    ],
)
def test_gemma_turns_a_malformed_call_into_an_error(text: str, message: str) -> None:
    parsed = GemmaParser().parse(text)
    assert parsed.calls == ()
    assert message in parsed.errors[0]
    assert parsed.content == text


def test_gemma_leaves_an_ordinary_json_answer_alone() -> None:
    assert GemmaParser().parse('{"answer": 4}') == ParsedCalls(content='{"answer": 4}')


# --- Choosing a parser, and the Finished event --------------------------------

QWEN_TEMPLATE_SNIPPET = "{{- '<tool_call>\\n' }}{{- tool_call.name }}<|im_start|>"
FUNCTIONGEMMA_SNIPPET = "<start_of_turn>developer<start_function_call>call:"
GEMMA3_SNIPPET = "{{ '<start_of_turn>' + role + '\\n' }}"


@pytest.mark.parametrize(
    ("template", "name"),
    [
        (QWEN_TEMPLATE_SNIPPET, "hermes"),
        (FUNCTIONGEMMA_SNIPPET, "function_gemma"),
        (GEMMA3_SNIPPET, "gemma"),
        # No markers and no `tools`: the default convention (service.tools.default_convention).
        ("{% for m in messages %}<|im_start|>{{ m.content }}{% endfor %}", "hermes"),
        # No markers, but it shows `tools` its own way: kept, and its output is all content.
        ("{{ tools | tojson }}{% for m in messages %}{{ m.content }}{% endfor %}", "none"),
        (None, "none"),
    ],
)
def test_the_parser_is_chosen_from_the_templates_markers(template: str | None, name: str) -> None:
    assert parser_for_template(template).name == name
    assert parser_for_template(template).parse("plain").content == "plain"


def finished(reason: FinishReason) -> Finished:
    return Finished(reason, Usage(5, 7, 0), Timing(1.0, 2.0, 3.0), seed=1)


def test_calls_end_the_stream_with_the_tool_call_reason() -> None:
    parsed = HermesParser().parse(QWEN_PARALLEL)
    event = with_tool_calls(finished(FinishReason.END_OF_TURN), parsed)
    assert event.finish_reason is FinishReason.TOOL_CALL
    message = event.to_pb().finished
    assert [call.name for call in message.tool_calls] == ["get_weather", "get_stock_price"]
    assert json.loads(message.tool_calls[0].arguments_json) == {"city": "Tokyo"}
    assert message.content == "I'll look both up."
    assert message.finish_reason == FinishReason.TOOL_CALL.value


def test_a_cut_off_generation_keeps_its_reason_and_errors_are_reported() -> None:
    parsed = HermesParser().parse('<tool_call>{"name": "a", "arguments": {"x": ')
    event = with_tool_calls(finished(FinishReason.LENGTH), parsed)
    assert event.finish_reason is FinishReason.LENGTH
    assert event.to_pb().finished.tool_call_errors[0].startswith("tool call 1: not valid JSON")
    no_calls = with_tool_calls(finished(FinishReason.END_OF_TURN), ParsedCalls("hello"))
    assert no_calls.finish_reason is FinishReason.END_OF_TURN
