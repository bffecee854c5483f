"""Grammars and schemas are bounded before llama.cpp or the converter expands them (issue 15)."""

from __future__ import annotations

import ctypes
import json
import math
import random
from collections.abc import Iterator
from typing import Any

import grpc
import jsonschema
import llama_cpp
import pytest
from llama_cpp import llama_grammar

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from service.backends.llama_cpp.log import captured_parser_output
from service.errors import InvalidRequest
from service.grammar import compile as compile_module
from service.grammar.compile import (
    MAX_GRAMMAR_CHARS,
    check_grammar,
    check_grammar_limits,
    grammar_from_json_schema,
    resolve_grammar,
)
from service.grammar.grammar_limits import GRAMMAR_LIMITS, GrammarLimits, SchemaLimits
from service.models.embedded import EMBEDDED_MODELS
from tests.conftest import SMOLLM, collect, text_of
from tests.hostile_grammars import random_grammar
from tests.test_generation_features import PERSON

ISSUE_SCHEMA = json.dumps({"type": "string", "pattern": "^a{0,100000}$"})
ISSUE_GRAMMAR = "root ::= " + "(" * 32_000 + '"a"' + ")" * 32_000


def nested(depth: int) -> str:
    return "root ::= " + "(" * depth + '"a"' + ")" * depth


def chain(length: int, body: str) -> str:
    """root ::= r0; r_i ::= body, where {next} is r_{i+1}; the last rule is a literal."""
    rules = ["root ::= r0", *(f"r{i} ::= " + body.format(next=f"r{i + 1}") for i in range(length))]
    return "\n".join([*rules, f'r{length} ::= "z"'])


@pytest.fixture
def no_llama(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if llama.cpp's grammar parser is called."""

    def parser_called(*args: object) -> None:
        raise AssertionError("llama.cpp's grammar parser was reached")

    monkeypatch.setattr(llama_cpp, "llama_sampler_init_grammar", parser_called)


# --- the issue's inputs --------------------------------------------------------------


def test_the_issues_grammar_is_refused_before_llama_cpp_parses_it(no_llama: None) -> None:
    assert len(ISSUE_GRAMMAR) < MAX_GRAMMAR_CHARS
    with pytest.raises(InvalidRequest, match=r"nesting of parentheses.*limit of 100 levels"):
        resolve_grammar(ISSUE_GRAMMAR, "")


def test_the_issues_schema_is_refused_before_the_converter_runs(
    no_llama: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def converter_called(*args: object) -> None:
        raise AssertionError("the converter was reached")

    monkeypatch.setattr(compile_module, "schema_to_gbnf", converter_called)
    message = "'{0,100000}' in the pattern at '/' exceeds this server's limit of 1000 repetitions"
    with pytest.raises(InvalidRequest, match=message):
        resolve_grammar(None, ISSUE_SCHEMA)


# --- GBNF: each limit, on both sides -----------------------------------------------------

LIMIT_CASES = [
    # (grammar, a limit low enough to refuse it, words the refusal must hold)
    ("root ::= [a-z]{0,11}", {"repetition": 10}, "'{0,11}' at line 1, column 15 .* 10 repetitions"),
    ('root ::= "a"{0,30}', {"rules": 20}, "limit of 20 rules"),
    ('root ::= "abcdefghij"{20}', {"elements": 100}, "limit of 100 elements"),
    (chain(30, '{next} "x"'), {"left_chain": 20}, "chain of rules starting one another"),
    (chain(9, '{next} "a" | {next} "b"'), {"left_work": 1000}, "left-recursion check"),
    ("root ::= " + " | ".join(f'"k{i}"' for i in range(50)), {"branches": 40}, "40 alternatives"),
    (nested(11), {"nesting": 10}, "nesting of parentheses at line 1, column 20"),
]


@pytest.mark.parametrize(("grammar", "low", "message"), LIMIT_CASES)
def test_each_grammar_limit_refuses_past_it_and_names_it(
    grammar: str, low: dict[str, int], message: str
) -> None:
    check_grammar(grammar)  # within the server's limits, and llama.cpp parses it
    with pytest.raises(InvalidRequest, match=message):
        check_grammar_limits(grammar, "`grammar`", GrammarLimits(**low))


def test_nesting_up_to_the_limit_parses_and_one_level_more_is_refused() -> None:
    check_grammar(nested(GRAMMAR_LIMITS.nesting))
    with pytest.raises(InvalidRequest, match="100 levels"):
        check_grammar(nested(GRAMMAR_LIMITS.nesting + 1))


@pytest.mark.parametrize(
    "grammar",
    [
        'root ::= root "a" | "b"',
        'root ::= x "a" | "b"\nx ::= root "c"',
        # llama.cpp's own check misses this one and loops until memory runs out:
        # `e` can match empty text, but has no literally empty alternative.
        'root ::= e root "x" | "y"\ne ::= f\nf ::= | "z"',
    ],
)
def test_left_recursion_is_refused_here(grammar: str, no_llama: None) -> None:
    with pytest.raises(InvalidRequest, match="rule 'root' is left-recursive"):
        check_grammar(grammar)


def test_llama_cpp_refuses_plain_left_recursion_cleanly() -> None:
    """The refusal is a NULL sampler and a log line, not a crash: safe to rely on."""
    with captured_parser_output():
        sampler = llama_cpp.llama_sampler_init_grammar(None, b'root ::= root "a" | "b"', b"root")
    assert not sampler


def test_a_maximum_below_the_minimum_is_refused(no_llama: None) -> None:
    # llama.cpp counts n - m unsigned: it would add rules until memory runs out.
    with pytest.raises(InvalidRequest, match=r"'\{5,2\}' has a maximum below its minimum"):
        check_grammar('root ::= "a"{5,2}')


def test_llama_cpps_own_repetition_threshold_is_applied_as_llama_cpp_applies_it() -> None:
    rules = '\nx ::= "a"\ny ::= "b"'
    check_grammar("root ::= (x y){666}" + rules)  # the group and x and y: 3 x 666 <= 2000
    with pytest.raises(InvalidRequest, match="exceeds sane defaults"):
        check_grammar("root ::= (x y){667}" + rules)


def test_rules_after_a_token_reference_are_measured_too(no_llama: None) -> None:
    # Without a vocabulary llama.cpp's parser stops at <think> and says nothing of
    # the rest, which would first be parsed when a sequence starts.
    with pytest.raises(InvalidRequest, match="nesting of parentheses"):
        check_grammar(nested(5000).replace("root ::= ", "root ::= <think> "))


@pytest.mark.parametrize(
    ("grammar", "message"),
    [('root ::= "a\x00"', "NUL"), ('root ::= "\ud800"', "not valid Unicode")],
)
def test_text_llama_cpp_would_misread_is_refused(grammar: str, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        check_grammar(grammar)


@pytest.mark.parametrize(
    "grammar",
    ['root ::= "a" [^\\x00-\\U0010FFFF]', "root ::= [b-a]", 'root ::= "\\x00"', "root ::= [\\x00]"],
)
def test_a_character_no_model_can_write_is_refused(grammar: str, no_llama: None) -> None:
    # With nothing left to sample and no way to end, llama.cpp aborts the process.
    with pytest.raises(InvalidRequest, match="requires a character no model can write"):
        check_grammar(grammar)


@pytest.mark.parametrize(
    "grammar", ["root ::= [\\x00-\\x01]", "root ::= [a-] [^a]", "root ::= [-a]"]
)
def test_classes_with_some_character_left_pass(grammar: str) -> None:
    check_grammar(grammar)


@pytest.mark.parametrize("name", [n for n in dir(llama_grammar) if n.endswith("_GBNF")])
def test_llama_cpps_example_grammars_pass(name: str) -> None:
    check_grammar(getattr(llama_grammar, name))


def test_this_parser_agrees_with_llama_cpps_on_random_grammars() -> None:
    """What passes here parses in llama.cpp; what is a syntax error here is one there.

    llama.cpp is only given text that passed, or that failed to parse here
    for a reason it also fails on quickly (never a limit, nor n < m).
    """
    rng = random.Random(15)
    agreed = 0
    for _ in range(400):
        text = random_grammar(rng).replace("undefined-rule", '"u"')
        verdict = _verdict(text)
        if verdict in ("limit", "below minimum"):
            continue
        parsed = _llama_parses(text)
        assert parsed or verdict != "ok" or _left_to_llama(text), text
        assert not parsed or verdict == "ok", text
        agreed += 1
    assert agreed > 200


def _verdict(text: str) -> str:
    try:
        check_grammar_limits(text, "g")
    except InvalidRequest as exc:
        if "below its minimum" in exc.message:
            return "below minimum"
        return "syntax" if "does not parse" in exc.message else "limit"
    return "ok"


def _llama_parses(text: str) -> bool:
    with captured_parser_output():
        sampler = llama_cpp.llama_sampler_init_grammar(None, text.encode(), b"root")
    if sampler:
        llama_cpp.llama_sampler_free(sampler)
    return bool(sampler)


def _left_to_llama(text: str) -> bool:
    """Refused by llama.cpp for what this module leaves to it: undefined rules, no root, tokens."""
    try:
        check_grammar(text)
    except InvalidRequest as exc:
        return any(word in exc.message for word in ("Undefined rule", "'root' symbol", "refused"))
    return True  # <think> needs a vocabulary: accepted here, checked at sequence start


# --- JSON schema: each limit, named with where it is ------------------------------------

COUNT_KEYWORDS = [
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "minContains",
    "maxContains",
]


def in_property(subschema: dict[str, Any]) -> str:
    return json.dumps({"type": "object", "properties": {"name": subschema}})


@pytest.mark.parametrize("keyword", COUNT_KEYWORDS)
def test_every_count_keyword_is_bounded(keyword: str) -> None:
    message = (
        f"{keyword} 1001 at '/properties/name' exceeds this server's limit of 1000 repetitions"
    )
    with pytest.raises(InvalidRequest, match=message):
        resolve_grammar(None, in_property({keyword: 1001}))


@pytest.mark.parametrize("value", [5.5, True, -1, "5"])
def test_a_count_that_is_no_count_is_refused(value: object) -> None:
    with pytest.raises(
        InvalidRequest, match="maxItems at '/properties/name' must be a non-negative"
    ):
        resolve_grammar(None, in_property({"type": "array", "maxItems": value}))


def test_a_minimum_above_its_maximum_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="maxLength 2 is below minLength 5"):
        resolve_grammar(None, in_property({"type": "string", "minLength": 5, "maxLength": 2}))


WHERE = "in the pattern at '/properties/name'"


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("^a{1001}$", f"'{{1001}}' {WHERE} exceeds this server's limit of 1000 repetitions"),
        ("^(a{2,1000}){0,1001}$", f"'{{0,1001}}' {WHERE} exceeds"),
        ("^a{5,2}$", f"'{{5,2}}' {WHERE} has a maximum below its minimum"),
        ("^" + "(" * 33 + "a" + ")" * 33 + "$", "nesting of the pattern at '/properties/name'"),
    ],
)
def test_a_patterns_counts_and_groups_are_bounded(pattern: str, message: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        resolve_grammar(None, in_property({"type": "string", "pattern": pattern}))
    assert message in caught.value.message


@pytest.mark.parametrize("keyword", ["enum", "anyOf", "oneOf"])
def test_alternatives_are_bounded(keyword: str) -> None:
    many = [{"const": i} for i in range(1025)] if keyword != "enum" else list(range(1025))
    with pytest.raises(InvalidRequest, match=f"{keyword} of 1025 alternatives .* 1024"):
        resolve_grammar(None, in_property({keyword: many}))


def test_properties_of_one_object_are_bounded() -> None:
    properties = {f"p{i}": {"type": "integer"} for i in range(257)}
    with pytest.raises(InvalidRequest, match="an object of 257 properties at '/'"):
        resolve_grammar(None, json.dumps({"type": "object", "properties": properties}))


def test_properties_an_allof_merges_are_bounded() -> None:
    # The converter makes one object of the parts' properties, optional ones
    # costing it the square of their number.
    parts: list[dict[str, Any]] = [
        {"properties": {f"p{part}_{i}": {} for i in range(200)}} for part in range(2)
    ]
    schema = {
        "allOf": [{"anyOf": parts[:1]}, {"$ref": "#/$defs/more"}],
        "$defs": {"more": parts[1]},
    }
    with pytest.raises(InvalidRequest, match="the allOf of 400 properties at '/'"):
        resolve_grammar(None, json.dumps(schema))


@pytest.mark.parametrize("depth", [65, 30_000])
def test_json_nesting_is_bounded_before_it_is_parsed(depth: int) -> None:
    text = '{"enum": [' + "[" * depth + "]" * depth + "]}"
    with pytest.raises(InvalidRequest, match=r"nesting of its JSON .* 64 levels"):
        resolve_grammar(None, text)


def test_an_integer_python_will_not_read_is_invalid_json() -> None:
    with pytest.raises(InvalidRequest, match="not valid JSON"):
        resolve_grammar(None, '{"enum": [' + "9" * 5000 + "]}")


@pytest.mark.parametrize(
    ("pattern", "message"), [("^\\ud800$", "not valid Unicode"), ("^a\\u0000$", "NUL")]
)
def test_a_pattern_llama_cpp_would_misread_is_refused(pattern: str, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        resolve_grammar(None, '{"type": "string", "pattern": "' + pattern + '"}')


def ref_chain(count: int, name: str) -> dict[str, Any]:
    """$defs each referring twice to the next, once at the start: upstream's blow-up."""
    defs: dict[str, Any] = {
        f"{name}{i}": {
            "anyOf": [
                {"$ref": f"#/$defs/{name}{i + 1}"},
                {"type": "array", "items": {"$ref": f"#/$defs/{name}{i + 1}"}},
            ]
        }
        for i in range(count)
    }
    defs[f"{name}{count}"] = {"type": "integer"}
    return {"type": "object", "properties": {"x": {"$ref": f"#/$defs/{name}0"}}, "$defs": defs}


def test_each_ref_is_converted_once_whatever_its_name() -> None:
    # Upstream visits node_i's target again at each reference when the name
    # holds an escaped character: 2^25 visits here. Converted once each, it fits.
    grammar_from_json_schema(json.dumps(ref_chain(25, "node_")), SchemaLimits(nodes=200))
    with pytest.raises(InvalidRequest, match="limit of 100 subschemas"):
        grammar_from_json_schema(json.dumps(ref_chain(25, "node_")), SchemaLimits(nodes=100))


def test_the_converters_depth_through_refs_is_bounded() -> None:
    defs = {f"d{i}": {"type": "array", "items": {"$ref": f"#/$defs/d{i + 1}"}} for i in range(10)}
    schema = {"type": "array", "items": {"$ref": "#/$defs/d0"}, "$defs": {**defs, "d10": {}}}
    grammar_from_json_schema(json.dumps(schema))
    with pytest.raises(InvalidRequest, match="nesting of its subschemas and \\$refs"):
        grammar_from_json_schema(json.dumps(schema), SchemaLimits(depth=10))


def test_the_grammar_a_schema_makes_is_bounded() -> None:
    with pytest.raises(InvalidRequest, match="characters of the grammar it makes"):
        grammar_from_json_schema(json.dumps(PERSON), SchemaLimits(grammar_chars=100))


@pytest.mark.parametrize(
    "schema",
    [
        {"properties": {"x": {"$ref": "#/$defs/a"}}, "$defs": {"a": {"$ref": "#/$defs/a"}}},
        {
            "properties": {"x": {"$ref": "#/$defs/a"}},
            "$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "integer"}]}},
        },
    ],
)
def test_a_ref_cycle_that_is_left_recursion_is_refused(schema: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest, match="rule 'a' is left-recursive"):
        resolve_grammar(None, json.dumps(schema))


# --- realistic schemas still pass, with flat repetitions -----------------------------

ADDRESS = {
    "type": "object",
    "properties": {
        "street": {"type": "string", "maxLength": 200},
        "city": {"type": "string", "maxLength": 100},
        "postcode": {"type": "string", "pattern": "^[0-9]{5}(-[0-9]{4})?$"},
        "country": {"type": "string", "minLength": 2, "maxLength": 2},
    },
    "required": ["street", "city", "country"],
}
INVOICE = {
    "type": "object",
    "properties": {
        "number": {"type": "string", "pattern": "^INV-[0-9]{6}$"},
        "date": {"type": "string", "format": "date"},
        "status": {"enum": ["draft", "sent", "paid", "void"]},
        "billing": {"$ref": "#/$defs/address_block"},
        "shipping": {"anyOf": [{"$ref": "#/$defs/address_block"}, {"type": "null"}]},
        "lines": {
            "type": "array",
            "minItems": 1,
            "maxItems": 200,
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
                    "quantity": {"type": "integer", "minimum": 1},
                    "price": {"type": "number"},
                    "note": {"type": "string", "maxLength": 500},
                },
                "required": ["sku", "quantity", "price"],
            },
        },
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 30}, "maxItems": 10},
    },
    "required": ["number", "date", "status", "billing", "lines"],
    "$defs": {"address_block": ADDRESS},
}
INVOICE_EXAMPLE = {  # the converter writes required properties first, then optional ones
    "number": "INV-000042",
    "date": "2026-12-01",
    "status": "sent",
    "billing": {"street": "1 Main St", "city": "Lyon", "country": "FR", "postcode": "69001"},
    "lines": [{"sku": "ABC-1234", "quantity": 2, "price": 9.5, "note": "gift"}],
    "shipping": None,
    "tags": ["q4"],
}
TREE = {
    "type": "object",
    "properties": {
        "value": {"type": "integer"},
        "children": {"$ref": "#/$defs/tree_node/properties/children"},
    },
    "$defs": {
        "tree_node": {
            "type": "object",
            "properties": {
                "value": {"type": "integer"},
                "children": {"type": "array", "items": {"$ref": "#/$defs/tree_node"}},
            },
        }
    },
}


def deep_object(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string", "maxLength": 20}
    for level in range(levels):
        schema = {
            "type": "object",
            "properties": {f"level{level}": schema, "n": {"type": "integer"}},
        }
    return schema


REALISTIC = {
    "person": PERSON,
    "a string of maxLength 500": {"type": "string", "maxLength": 500},
    "an array of 1 to 300 items": {
        "type": "array",
        "items": {"type": "number"},
        "minItems": 1,
        "maxItems": 300,
    },
    "objects a dozen deep": deep_object(12),
    "an enum of 1000 names": {"enum": [f"name-{i:04d}" for i in range(1000)]},
    "an invoice": INVOICE,
    "a recursive tree": TREE,
    "a definition named like a built-in": {
        "type": "object",
        "properties": {"s": {"$ref": "#/$defs/string"}},
        "$defs": {"string": {"type": "object", "properties": {"s": {"$ref": "#/$defs/string"}}}},
    },
}


def _gbnf(schema: object) -> str:
    """The checked grammar text built from `schema`."""
    resolved = resolve_grammar(None, json.dumps(schema))
    assert resolved is not None
    return resolved.text


@pytest.mark.parametrize("name", list(REALISTIC))
def test_realistic_schemas_pass(name: str) -> None:
    check_grammar(_gbnf(REALISTIC[name]))


def test_long_repetitions_are_chained_rules_not_nested_groups() -> None:
    gbnf = _gbnf({"type": "string", "maxLength": 500})
    assert "char{0,500}" in gbnf
    assert "(char (char" not in gbnf  # upstream's form: 500 levels of parentheses


# --- the grammars still say what the schemas say --------------------------------------


@pytest.fixture(scope="module")
def vocab() -> Iterator[Any]:
    """SmolLM2's vocabulary alone (no weights): what a sequence's grammar sampler is built with."""
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    path = str(EMBEDDED_MODELS[SMOLLM].locate()).encode()
    model = llama_cpp.llama_model_load_from_file(path, params)
    yield llama_cpp.llama_model_get_vocab(model)
    llama_cpp.llama_model_free(model)


def accepts(vocab: Any, gbnf: str, text: str) -> bool:
    """Whether sampling under `gbnf` could produce `text` and then end, token by token."""
    sampler = llama_cpp.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root")
    assert sampler
    try:
        for token in [*tokens(vocab, text), llama_cpp.llama_vocab_eos(vocab)]:
            if not allowed(sampler, token):
                return False
            llama_cpp.llama_sampler_accept(sampler, token)
        return True
    finally:
        llama_cpp.llama_sampler_free(sampler)


def tokens(vocab: Any, text: str) -> list[int]:
    data = text.encode()
    ids = (llama_cpp.llama_token * (len(data) + 8))()
    count = llama_cpp.llama_tokenize(vocab, data, len(data), ids, len(ids), False, False)
    return list(ids[:count])


def allowed(sampler: Any, token: int) -> bool:
    """The grammar sampler's verdict on `token` as the next one (accepting a refused one aborts)."""
    candidate = (llama_cpp.llama_token_data * 1)(llama_cpp.llama_token_data(token, 0.0, 0.0))
    candidates = llama_cpp.llama_token_data_array(candidate, 1, -1, False)
    llama_cpp.llama_sampler_apply(sampler, ctypes.byref(candidates))
    return bool(candidate[0].logit != -math.inf)


SURVEY = {
    "type": "object",
    "properties": {
        "colors": {
            "type": "array",
            "items": {"enum": ["red", "green", "blue"]},
            "minItems": 2,
            "maxItems": 3,
        },
        "code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2}$"},
    },
    "required": ["colors", "code"],
    "additionalProperties": False,
}
LANGUAGE_CASES = [
    # (schema, documents it accepts, documents it refuses)
    (
        SURVEY,
        [{"colors": ["red", "blue"], "code": "AB12"}, {"colors": ["red"] * 3, "code": "ZZ00"}],
        [
            {"colors": ["red"], "code": "AB12"},
            {"colors": ["red"] * 4, "code": "AB12"},
            {"colors": ["red", "blue"], "code": "ABC1"},
            {"colors": ["red", "blue"], "code": "AB123"},
        ],
    ),
    ({"type": "string", "maxLength": 500}, ["", "a" * 500], ["a" * 501]),
    ({"type": "string", "minLength": 3, "maxLength": 5}, ["abc", "abcde"], ["ab", "abcdef"]),
    (REALISTIC["an array of 1 to 300 items"], [[1.5], list(range(300))], [[], list(range(301))]),
    (
        REALISTIC["a recursive tree"],
        [{"value": 1, "children": [{"value": 2, "children": [{"value": 3}]}]}],
        [{"value": 1, "children": [{"value": "2"}]}],
    ),
    (
        REALISTIC["a definition named like a built-in"],
        [{"s": {"s": {}}}],
        [{"s": "text"}],  # upstream refers to its built-in `string` here, and accepts this
    ),
    (
        INVOICE,
        [INVOICE_EXAMPLE],
        [{**INVOICE_EXAMPLE, "lines": []}, {**INVOICE_EXAMPLE, "number": "INV-12"}],
    ),
]


@pytest.mark.parametrize(("schema", "valid", "invalid"), LANGUAGE_CASES[:4])
def test_counted_repetitions_say_what_upstreams_nested_groups_say(
    vocab: Any, schema: dict[str, Any], valid: list[Any], invalid: list[Any]
) -> None:
    upstream = llama_grammar.json_schema_to_gbnf(json.dumps(schema))
    ours = _gbnf(schema)
    for document in valid + invalid:
        text = json.dumps(document)
        assert accepts(vocab, ours, text) == accepts(vocab, upstream, text), document


@pytest.mark.parametrize(("schema", "valid", "invalid"), LANGUAGE_CASES)
def test_the_grammar_accepts_what_the_schema_accepts_and_nothing_else(
    vocab: Any, schema: dict[str, Any], valid: list[Any], invalid: list[Any]
) -> None:
    gbnf = _gbnf(schema)
    for document in valid:
        jsonschema.validate(document, schema)
        assert accepts(vocab, gbnf, json.dumps(document)), document
    for document in invalid:
        assert not accepts(vocab, gbnf, json.dumps(document)), document


# --- through a real server ---------------------------------------------------------------


def generate(stub: pb_grpc.InferenceStub, **fields: Any) -> list[pb.GenerateResponse]:
    request = pb.GenerateRequest(model=SMOLLM, temperature=0.0, **fields)
    return collect(stub.Generate(request))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"response_format": pb.ResponseFormat(json_schema=ISSUE_SCHEMA)}, "1000 repetitions"),
        ({"grammar": ISSUE_GRAMMAR}, "100 levels"),
    ],
)
def test_the_issues_requests_are_invalid_argument_and_the_server_lives(
    stub: pb_grpc.InferenceStub, fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        generate(stub, prompt="hi", max_tokens=2, **fields)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in (caught.value.details() or "")
    assert text_of(generate(stub, prompt="The sky is", max_tokens=2))
