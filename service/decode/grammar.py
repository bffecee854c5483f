"""GBNF grammars that constrain sampling: built from a JSON schema, checked before any model work.

Both steps use llama.cpp's own code, so what passes here is what the sampler
accepts: `json_schema_to_gbnf` is llama-cpp-python's port of llama.cpp's
converter, and the check runs llama.cpp's grammar parser by creating a grammar
sampler without a vocabulary (`llama_sampler_init_grammar(NULL, ...)`), which
parses the text and needs no model.

The parser prints its reason for a failure ("Undefined rule identifier 'foo'")
to the process's stderr rather than to llama.cpp's log, so the check captures
file descriptor 2 for the few microseconds it runs, under a lock, and writes
back anything in it that is not the parser's.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import llama_cpp
from llama_cpp.llama_grammar import json_schema_to_gbnf

from service.backends.llama_log import captured_native_log
from service.errors import InvalidRequest

MAX_GRAMMAR_CHARS = 64 * 1024
MAX_JSON_SCHEMA_CHARS = 64 * 1024
ROOT_RULE = "root"

_PARSER_MARKER = "error parsing grammar: "
# Token references such as <think> or <[1234]> name vocabulary entries; the
# parser cannot resolve them without a model, so they are checked when the
# sampler is built against the model's vocabulary.
_NEEDS_VOCAB = "no vocab to parse token"

_stderr_lock = threading.Lock()

# What the converter raises on a schema it cannot handle: `assert` for
# unsupported keywords, KeyError for unknown types or refs, ValueError for
# bad patterns, AttributeError/TypeError for values of the wrong JSON type.
_CONVERTER_ERRORS = (
    AssertionError,
    KeyError,
    ValueError,
    AttributeError,
    TypeError,
    IndexError,
    RecursionError,
)


def resolve_grammar(grammar: str | None, json_schema: str) -> str | None:
    """The GBNF text that should constrain a request, checked; None if unconstrained.

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
        check_grammar(grammar, what="`grammar`")
        return grammar
    if json_schema:
        gbnf = grammar_from_json_schema(json_schema)
        check_grammar(gbnf, what="the grammar built from `response_format.json_schema`")
        return gbnf
    return None


def grammar_from_json_schema(schema: str) -> str:
    """GBNF accepting the JSON documents `schema` (JSON Schema text) accepts."""
    if len(schema) > MAX_JSON_SCHEMA_CHARS:
        raise InvalidRequest(
            f"`response_format.json_schema` is limited to {MAX_JSON_SCHEMA_CHARS} characters"
        )
    try:
        parsed = json.loads(schema)
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"`response_format.json_schema` is not valid JSON: {exc}") from exc
    if not isinstance(parsed, dict):
        raise InvalidRequest("`response_format.json_schema` must be a JSON object")
    try:
        return str(json_schema_to_gbnf(schema))
    except _CONVERTER_ERRORS as exc:
        detail = str(exc) or type(exc).__name__
        raise InvalidRequest(
            f"`response_format.json_schema` cannot be turned into a grammar: {detail}"
        ) from exc


def check_grammar(gbnf: str, what: str = "the grammar") -> None:
    """Raise InvalidRequest, with llama.cpp's reason, when `gbnf` does not parse."""
    with captured_native_log() as logged, _captured_stderr() as printed:
        sampler = llama_cpp.llama_sampler_init_grammar(
            None, gbnf.encode("utf-8"), ROOT_RULE.encode("utf-8")
        )
    if sampler:
        llama_cpp.llama_sampler_free(sampler)
        return
    reason = _parser_reason(printed) or "; ".join(line for line in logged if line)
    if _NEEDS_VOCAB in reason:
        return
    raise InvalidRequest(f"{what} does not parse: {reason or 'llama.cpp refused it'}")


def _parser_reason(printed: list[str]) -> str:
    text = "".join(printed)
    start = text.find(_PARSER_MARKER)
    if start < 0:
        return ""
    return text[start + len(_PARSER_MARKER) :].split("\n", 1)[0].strip()


@contextmanager
def _captured_stderr() -> Iterator[list[str]]:
    """What is written to file descriptor 2 inside the block; other writers' text goes back."""
    printed: list[str] = []
    with _stderr_lock, tempfile.TemporaryFile() as sink:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            yield printed
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            text = sink.read().decode("utf-8", errors="replace")
            printed.append(text)
            foreign = text[: text.find(_PARSER_MARKER)] if _PARSER_MARKER in text else text
            foreign = foreign.removesuffix("parse: ")
            if foreign:
                os.write(2, foreign.encode("utf-8"))
