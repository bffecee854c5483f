"""GBNF grammars that constrain sampling: built from a JSON schema, checked before any model work.

A grammar reaches llama.cpp only after it has been measured: the request's
grammar, or the one built from its JSON schema, is read by `gbnf_scan` and
`gbnf_graph` against the limits in `grammar_limits` (nesting, repetitions,
rules, left recursion, fan-out); a schema is bounded on the schema first
(`schema_limits`), then converted by llama-cpp-python's converter through
`schema_converter`, which bounds its work. Only then does llama.cpp's own
parser run on it, by creating a grammar sampler without a vocabulary
(`llama_sampler_init_grammar(NULL, ...)`), so that what passes here is what
the sampler accepts; the same text is parsed again with the model's
vocabulary when a sequence starts, and the limits hold there too.

The parser prints its reason for a failure ("Undefined rule identifier 'foo'")
to the process's stderr rather than to llama.cpp's log, so the check captures
file descriptor 2 for the few microseconds it runs, under a lock, and writes
back anything in it that is not the parser's.
"""

from __future__ import annotations

import json

import llama_cpp

from service.backends.llama_cpp.log import (
    PARSER_MARKER,
    captured_native_log,
    captured_parser_output,
)
from service.errors import InvalidRequest, excerpt
from service.grammar.gbnf_graph import check_rule_graph
from service.grammar.gbnf_scan import parse_gbnf
from service.grammar.grammar_limits import (
    GRAMMAR_LIMITS,
    SCHEMA_LIMITS,
    GrammarLimits,
    SchemaLimits,
    limit_exceeded,
)
from service.grammar.schema_converter import schema_to_gbnf
from service.grammar.schema_limits import WHAT, check_json_depth, check_schema
from service.text.requests import Grammar

MAX_GRAMMAR_CHARS = 64 * 1024
MAX_JSON_SCHEMA_CHARS = 64 * 1024
ROOT_RULE = "root"

# Token references such as <think> or <[1234]> name vocabulary entries; the
# parser cannot resolve them without a model, so they are checked when the
# sampler is built against the model's vocabulary.
_NEEDS_VOCAB = "no vocab to parse token"


# What the converter raises on a schema it cannot handle: `assert` for
# unsupported keywords, KeyError for unknown types or refs, ValueError for
# bad patterns, AttributeError/TypeError for values of the wrong JSON type.
# (Its depth is bounded beforehand; RecursionError stays as a backstop.)
CONVERTER_ERRORS = (
    AssertionError,
    KeyError,
    ValueError,
    AttributeError,
    TypeError,
    IndexError,
    RecursionError,
)


def resolve_grammar(grammar: str | None, json_schema: str) -> Grammar | None:
    """The GBNF that should constrain a request, checked; None if unconstrained.

    `grammar` is the request's GBNF (None when unset) and `json_schema` its
    response_format.json_schema (empty when unset); setting both is refused.
    """
    if grammar is not None and json_schema:
        raise InvalidRequest("set either `grammar` or `response_format.json_schema`, not both")
    if grammar is not None:
        if not grammar.strip():
            raise InvalidRequest("`grammar` is set but empty")
        if len(grammar) > MAX_GRAMMAR_CHARS:
            raise InvalidRequest(f"`grammar` is limited to {MAX_GRAMMAR_CHARS} characters")
        return Grammar(grammar, check_grammar(grammar, what="`grammar`"))
    if json_schema:
        gbnf = grammar_from_json_schema(json_schema)
        return Grammar(gbnf, check_grammar(gbnf, what=f"the grammar built from {WHAT}"))
    return None


def grammar_from_json_schema(schema: str, limits: SchemaLimits = SCHEMA_LIMITS) -> str:
    """GBNF accepting the JSON documents `schema` (JSON Schema text) accepts."""
    if len(schema) > MAX_JSON_SCHEMA_CHARS:
        raise InvalidRequest(f"{WHAT} is limited to {MAX_JSON_SCHEMA_CHARS} characters")
    check_json_depth(schema, limits)
    try:
        parsed = json.loads(schema)
    except (ValueError, RecursionError) as exc:  # ValueError: also an int of 4300+ digits
        raise InvalidRequest(f"{WHAT} is not valid JSON: {excerpt(str(exc), 200)}") from exc
    if not isinstance(parsed, dict):
        raise InvalidRequest(f"{WHAT} must be a JSON object")
    check_schema(parsed, limits)
    try:
        gbnf = schema_to_gbnf(parsed, limits)
    except CONVERTER_ERRORS as exc:
        detail = excerpt(str(exc) or type(exc).__name__, 200)
        raise InvalidRequest(f"{WHAT} cannot be turned into a grammar: {detail}") from exc
    if len(gbnf) > limits.grammar_chars:
        subject = f"the {len(gbnf)} characters of the grammar it makes"
        raise limit_exceeded(WHAT, subject, limits.grammar_chars, "characters")
    return gbnf


def check_grammar(gbnf: str, what: str = "the grammar") -> int:
    """Raise InvalidRequest when `gbnf` crosses a limit or does not parse (llama.cpp's
    reason); else return its widest fan-out (see check_grammar_limits)."""
    width = check_grammar_limits(gbnf, what)
    with captured_native_log() as logged, captured_parser_output() as printed:
        sampler = llama_cpp.llama_sampler_init_grammar(
            None, gbnf.encode("utf-8"), ROOT_RULE.encode("utf-8")
        )
    if sampler:
        llama_cpp.llama_sampler_free(sampler)
        return width
    reason = _parser_reason(printed) or "; ".join(line for line in logged if line)
    if _NEEDS_VOCAB in reason:
        return width
    # The reason can quote the grammar (a rule's name, the text after an error).
    detail = excerpt(reason, 200) if reason else "llama.cpp refused it"
    raise InvalidRequest(f"{what} does not parse: {detail}")


def check_grammar_limits(gbnf: str, what: str, limits: GrammarLimits = GRAMMAR_LIMITS) -> int:
    """Refuse `gbnf` if it does not parse or crosses a limit, before llama.cpp reads it;
    else return its widest fan-out: the most parser stacks one position can lead to
    (the whole limit when the grammar is left for llama.cpp to judge).

    A grammar naming an undefined rule, or lacking `root`, is left for
    llama.cpp to refuse in its own words: by then it has been read to the end.
    """
    if "\x00" in gbnf:
        raise InvalidRequest(f"{what} contains a NUL character")
    try:
        gbnf.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidRequest(f"{what} is not valid Unicode: {exc.reason}") from exc
    parsed = parse_gbnf(gbnf, what, limits)
    if parsed.complete():
        return check_rule_graph(parsed, what, limits)
    return limits.branches


def _parser_reason(printed: list[str]) -> str:
    text = "".join(printed)
    start = text.find(PARSER_MARKER)
    if start < 0:
        return ""
    return text[start + len(PARSER_MARKER) :].split("\n", 1)[0].strip()
