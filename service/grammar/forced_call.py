"""The grammar that makes a model call a tool (`tool_choice`), in its own convention.

A forced call is constrained the way a JSON schema response is: the output
must be one or more calls written as the model's convention writes them
(`service.tools.base.CallShape`), each naming one of the allowed tools and
carrying arguments that its `parameters_json` schema accepts. Every tool's
schema goes through the same bounded converter as `response_format` (one
converter for all of them, so the limits hold for the request as a whole),
and the result through the same checks as any grammar.

The convention comes from the model's chat template, so the grammar is built
where the model is loaded, when the request is prepared, not by the front.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from service.errors import InvalidRequest, excerpt
from service.grammar.compile import CONVERTER_ERRORS, check_grammar
from service.grammar.grammar_limits import SCHEMA_LIMITS, SchemaLimits, limit_exceeded
from service.grammar.schema_converter import BoundedSchemaConverter
from service.grammar.schema_limits import WHAT, check_json_depth, check_schema
from service.text.requests import Grammar, Tool, ToolChoice
from service.tools.base import CallShape

WHAT_FORCED = "the grammar forcing a tool call"


def forced_call_grammar(
    shape: CallShape,
    tools: tuple[Tool, ...],
    choice: ToolChoice,
    limits: SchemaLimits = SCHEMA_LIMITS,
) -> Grammar:
    """GBNF accepting calls of `choice`'s tools in `shape`, checked like any grammar."""
    converter = BoundedSchemaConverter(limits)
    calls = []
    for index, tool in enumerate(choice.tools(tools)):
        arguments = _arguments_rule(converter, tool, index, limits)
        opening = _literal(shape.opening + tool.name + shape.between)
        calls.append(f"{opening} {arguments} {_literal(shape.closing)}")
    converter._add_rule("call", " | ".join(calls))
    if shape.separator is None or not choice.parallel_calls:
        converter._add_rule("root", "call")
    else:
        converter._add_rule("root", f"call ({_literal(shape.separator)} call)*")
    gbnf = str(converter.format_grammar())  # type: ignore[no-untyped-call]
    if len(gbnf) > limits.grammar_chars:
        subject = f"the {len(gbnf)} characters of the grammar"
        raise limit_exceeded(WHAT_FORCED, subject, limits.grammar_chars, "characters")
    return Grammar(gbnf, check_grammar(gbnf, what=WHAT_FORCED))


def _arguments_rule(
    converter: BoundedSchemaConverter, tool: Tool, index: int, limits: SchemaLimits
) -> str:
    """The rule for one tool's arguments: a JSON object its schema accepts."""
    with _about(f"tools[{index}] ({tool.name}) parameters_json"):
        check_json_depth(tool.parameters_json, limits)
        schema = tool.parameters()
        check_schema(schema, limits)
        # Each tool's $refs resolve within its own schema: the URL keys them apart.
        resolved = converter.resolve_refs(schema, f"tool{index}")
        return converter.visit(resolved, f"{tool.name}-arguments")


@contextlib.contextmanager
def _about(subject: str) -> Iterator[None]:
    """Errors of the schema checks, which speak of `response_format`, about `subject`."""
    try:
        yield
    except InvalidRequest as exc:
        raise InvalidRequest(exc.message.replace(WHAT, subject, 1)) from exc
    except CONVERTER_ERRORS as exc:
        detail = excerpt(str(exc) or type(exc).__name__, 200)
        raise InvalidRequest(f"{subject} cannot be turned into a grammar: {detail}") from exc


_ESCAPES = str.maketrans({"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r"})


def _literal(text: str) -> str:
    """`text` as a GBNF string literal (names are letters, digits, `_` and `-`)."""
    return f'"{text.translate(_ESCAPES)}"'
