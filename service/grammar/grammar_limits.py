"""How much a grammar or a JSON schema may make the server build, and why each bound.

llama.cpp trusts its grammars: it parses them recursively (about 500 bytes of
native stack per level of parentheses, so some thousands of levels kill the
process), expands repetitions by copying, and walks rule graphs in ways that
can take exponential time or never end. llama-cpp-python's JSON Schema
converter is plain Python with the same trust. So every grammar is measured
before either sees it (`gbnf_scan`, `gbnf_graph`, `schema_limits`), against
the limits here, and a request past one is INVALID_ARGUMENT naming it.

The values let real schemas and grammars through: a string of maxLength 500,
an array of a few hundred items, objects a dozen deep, an enum of a thousand
names, llama.cpp's example grammars.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.errors import InvalidRequest


@dataclass(frozen=True)
class GrammarLimits:
    """What one GBNF grammar may ask llama.cpp to build."""

    # Parentheses nested this deep: 50 KB of native stack, safe on any thread.
    nesting: int = 100
    # One `{m,n}`: m copies inline, n - m chained rules.
    repetition: int = 1000
    # Rules, synthesized ones included, and their elements (characters, ranges,
    # references, tokens): together they bound memory and parse time.
    rules: int = 10_000
    elements: int = 100_000
    # The longest chain of rules each able to start with the next: the depth of
    # llama.cpp's recursive left-recursion check (4000 crash a 256 KB thread
    # stack) and of one parser stack, which its stack advance copies at each
    # level (quadratic: 1000 take llama.cpp 50 ms). The converter writes one such
    # link per optional property of an object, so this stays above `properties`.
    left_chain: int = 512
    # Parser stacks one position can fan out to. Every sampling step checks
    # each stack against the whole vocabulary (0.3 ms per stack for SmolLM2's
    # 49k tokens on one shared CPU core; Gemma's 262k cost 5x), so this bounds
    # a step's cost: an enum of 1000 names costs about 0.4 s per token there.
    branches: int = 1024
    # Rule visits of llama.cpp's left-recursion check, which revisits shared rules.
    left_work: int = 2_000_000


@dataclass(frozen=True)
class SchemaLimits:
    """What one `response_format.json_schema` may ask the converter to build."""

    # Nesting of the schema's JSON (objects and arrays), and of the converter's
    # recursion through subschemas and $refs.
    depth: int = 64
    # Subschemas the converter visits: it is Python, and each visit costs.
    nodes: int = 5000
    # Any count: minLength, maxLength, minItems, maxItems, minProperties,
    # maxProperties, minContains, maxContains, and every {m,n} of a pattern.
    repetition: int = 1000
    # Properties of one object: the converter's rules for optional properties
    # grow with their square.
    properties: int = 256
    # Values of one enum, subschemas of one anyOf or oneOf: each is an
    # alternative the sampler tracks at every step (see GrammarLimits.branches).
    alternatives: int = 1024
    # Groups nested in one pattern: each is a level of parentheses in the grammar.
    pattern_nesting: int = 32
    # The grammar the converter writes, in characters.
    grammar_chars: int = 256 * 1024


GRAMMAR_LIMITS = GrammarLimits()
SCHEMA_LIMITS = SchemaLimits()


def limit_exceeded(what: str, subject: str, limit: int, unit: str) -> InvalidRequest:
    """The error for `subject` of `what` crossing a limit; `subject` holds client text excerpted."""
    return InvalidRequest(f"{what}: {subject} exceeds this server's limit of {limit} {unit}")
