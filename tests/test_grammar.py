"""Grammars for structured output: built and checked before any model work."""

from __future__ import annotations

import json

import pytest

from service.errors import InvalidRequest
from service.grammar.compile import check_grammar, grammar_from_json_schema, resolve_grammar
from service.text.requests import Grammar

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


def test_a_json_schema_becomes_a_grammar_that_parses() -> None:
    gbnf = grammar_from_json_schema(json.dumps(PERSON))
    assert "root ::=" in gbnf
    assert '\\"name\\"' in gbnf
    check_grammar(gbnf)


def test_resolve_builds_from_the_schema_and_keeps_a_given_grammar() -> None:
    assert resolve_grammar(None, "") is None
    built = resolve_grammar(None, json.dumps(PERSON))
    assert built is not None
    assert "root ::=" in built.text
    grammar = 'root ::= "yes" | "no"'
    assert resolve_grammar(grammar, "") == Grammar(grammar, branches=2)


@pytest.mark.parametrize(
    ("grammar", "message"),
    [
        ('root ::= "a" foo', "Undefined rule identifier 'foo'"),
        ('root ::= ("a"', "expecting '\\)'"),
        ('answer ::= "a"', "root"),
        ("   ", "empty"),
    ],
)
def test_a_grammar_that_does_not_parse_is_refused_with_the_parsers_reason(
    grammar: str, message: str
) -> None:
    with pytest.raises(InvalidRequest, match=message):
        resolve_grammar(grammar, "")


def test_the_parsers_complaint_does_not_leak_to_stderr(capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(InvalidRequest):
        check_grammar('root ::= "a" foo')
    assert "error parsing grammar" not in capfd.readouterr().err


def test_token_references_are_left_for_the_models_vocabulary() -> None:
    check_grammar('root ::= <think> "a"')


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"type": "quaternion"}', "cannot be turned into a grammar"),
        ('{"$ref": "https://example.com/schema.json"}', "cannot be turned into a grammar"),
        ('{"type": "string", "pattern": "abc"}', "cannot be turned into a grammar"),
    ],
)
def test_a_schema_the_converter_rejects_is_an_invalid_request(schema: str, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        resolve_grammar(None, schema)


def test_grammar_and_json_schema_together_are_refused() -> None:
    with pytest.raises(InvalidRequest, match="not both"):
        resolve_grammar('root ::= "a"', json.dumps(PERSON))
