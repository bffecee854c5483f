"""Hostile and borderline grammars and JSON schemas, named and seeded-random.

For throwing at `resolve_grammar`, or at a real server in a subprocess: every
case must be either accepted or refused with INVALID_ARGUMENT, quickly, and
the process must live. `named_cases()` are the known ways to hurt llama.cpp or
llama-cpp-python's converter (the issue's own inputs first) and the borderline
cases on each side of this server's limits; `random_cases(seed, count)` are
structured random grammars and schemas, some of them mutated into garbage.

    from tests.hostile_grammars import hostile_cases
    for case in hostile_cases(seed=1, count=300):
        request = pb.GenerateRequest(prompt="hi", max_tokens=2, **case.request_fields())

Only the standard library: `random.Random(seed)` makes every run repeatable.
"""

from __future__ import annotations

import json
import random
import string
from dataclasses import dataclass
from typing import Any

from service.grammar.grammar_limits import GRAMMAR_LIMITS, SCHEMA_LIMITS


@dataclass(frozen=True)
class HostileCase:
    """One request's grammar or schema; exactly one of the two is set."""

    name: str
    grammar: str | None = None
    json_schema: str = ""

    def request_fields(self) -> dict[str, Any]:
        """Keyword arguments for pb.GenerateRequest (response_format as a plain dict)."""
        if self.grammar is not None:
            return {"grammar": self.grammar}
        return {"response_format": {"json_schema": self.json_schema}}


def hostile_cases(seed: int = 0, count: int = 200) -> list[HostileCase]:
    return named_cases() + random_cases(seed, count)


def named_cases() -> list[HostileCase]:
    return [*_issue_cases(), *_grammar_cases(), *_schema_cases()]


def _grammar(name: str, text: str) -> HostileCase:
    return HostileCase(name, grammar=text)


def _schema(name: str, schema: object) -> HostileCase:
    text = schema if isinstance(schema, str) else json.dumps(schema)
    return HostileCase(name, json_schema=text)


def _issue_cases() -> list[HostileCase]:
    deep = 32_000
    return [
        _schema("issue: pattern a{0,100000}", {"type": "string", "pattern": "^a{0,100000}$"}),
        _grammar("issue: 32000 nested groups", "root ::= " + "(" * deep + '"a"' + ")" * deep),
    ]


def _nested(depth: int) -> str:
    return "root ::= " + "(" * depth + '"a"' + ")" * depth


def _chain(length: int, body: str) -> str:
    """root ::= r0; each r_i ::= body with {next} standing for r_{i+1}."""
    rules = ["root ::= r0"]
    rules += [f"r{i} ::= " + body.format(next=f"r{i + 1}") for i in range(length)]
    return "\n".join([*rules, f'r{length} ::= "z"'])


def _grammar_cases() -> list[HostileCase]:
    limit = GRAMMAR_LIMITS
    return [
        _grammar("nesting at the limit", _nested(limit.nesting)),
        _grammar("nesting past the limit", _nested(limit.nesting + 1)),
        _grammar("nesting 5000", _nested(5000)),
        _grammar(
            "nesting through alternatives", "root ::= " + '("a" | ' * 3000 + '"b"' + ")" * 3000
        ),
        _grammar("maximum below minimum", 'root ::= "a"{5,2}'),
        _grammar("count past uint64", 'root ::= "a"{0,99999999999999999999999}'),
        _grammar("count of 5000 digits", 'root ::= "a"{' + "9" * 5000 + "}"),
        _grammar("count past llama.cpp's threshold", 'root ::= "a"{2001}'),
        _grammar("count at the limit", f"root ::= [a-z]{{0,{limit.repetition}}}"),
        _grammar("count past the limit", f"root ::= [a-z]{{0,{limit.repetition + 1}}}"),
        _grammar("stacked counts", 'root ::= "a"{44}{44}'),
        _grammar("nested counts", 'root ::= (("a"{40}){40}){40}'),
        _grammar("long literal repeated", 'root ::= "' + "x" * 60_000 + '"{1000}'),
        _grammar("many repetitions", "root ::= " + " ".join(["[a-z]{0,1000}"] * 30)),
        _grammar("many optionals", "root ::= " + ' "a"?' * 12_000),
        _grammar("chain of leading rules", _chain(3000, '{next} "x"')),
        _grammar("chain of nullable rules", 'root ::= ("a" | ){0,1000} "b"'),
        _grammar("direct left recursion", 'root ::= root "a" | "b"'),
        _grammar("indirect left recursion", 'root ::= x "a" | "b"\nx ::= root "c"'),
        _grammar("left recursion through empty", 'root ::= e root "x" | "y"\ne ::= f\nf ::= | "z"'),
        _grammar("exponential left-recursion check", _chain(40, '{next} "a" | {next} "b"')),
        _grammar("exponential stacks", _chain(30, "| {next} {next}")),
        _grammar("5000 alternatives", "root ::= " + " | ".join(f'"k{i}"' for i in range(5000))),
        _grammar("ambiguous nesting", 'root ::= s\ns ::= "x" s "a" | "x" s "b" | "y"'),
        _grammar("NUL character", 'root ::= "a\x00b"'),
        _grammar("lone surrogate", 'root ::= "\ud800"'),
        _grammar("bad escapes", 'root ::= "\\x4" "\\u12" "\\q"'),
        _grammar("out-of-range escape", 'root ::= "\\U00110000" [\\U0010FFFF-\\U00000000]'),
        _grammar("token id too big", "root ::= <[4294967296]>"),
        _grammar("token id past the vocabulary", "root ::= <[999999999]>"),
        _grammar("token text", 'root ::= <think> "a" !<[1]>'),
        # No token can go on and the grammar cannot end: llama.cpp's sampler aborts.
        _grammar("a class matching nothing", 'root ::= "a" [^\\x00-\\U0010FFFF]'),
        _grammar("an inverted range", "root ::= [b-a]"),
        _grammar("a NUL escape", 'root ::= "\\x00"'),
        _grammar("an end-of-generation token required", "root ::= <[2]> | <[0]>"),
        _grammar("unterminated token", "root ::= <" + "a" * 1000),
        _grammar("empty rule", "root ::="),
        _grammar("only comments", "# nothing\n# here\n"),
        _grammar("CRLF and comments", 'root ::= "a" # c\r\n  | x\r\nx ::= [b-c]{2,3}\r\n'),
        _grammar("comment inside counts", 'root ::= ("a"{1 # two\n,2})'),
        _grammar("undefined rule deep inside", "root ::= " + "(" * 90 + "nope" + ")" * 90),
    ]


def _defs_chain(count: int, name: str) -> dict[str, Any]:
    """$defs whose every entry refers twice to the next: exponential for the upstream converter."""
    defs: dict[str, Any] = {
        f"{name}{i}": {"anyOf": [{"$ref": f"#/$defs/{name}{i + 1}"}] * 2} for i in range(count)
    }
    defs[f"{name}{count}"] = {"type": "integer"}
    return {"type": "object", "properties": {"x": {"$ref": f"#/$defs/{name}0"}}, "$defs": defs}


def _schema_cases() -> list[HostileCase]:
    limit = SCHEMA_LIMITS
    tree = {
        "type": "object",
        "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#"}}},
    }
    node = {"properties": {"next": {"$ref": "#/$defs/node_x"}}, "type": "object"}
    deep_properties = '{"type":"object","properties":{"a":' * 400 + "{}" + "}}" * 400
    return [
        _schema("maxLength 100000", {"type": "string", "maxLength": 100_000}),
        _schema("maxLength at the limit", {"type": "string", "maxLength": limit.repetition}),
        _schema("minLength past the limit", {"type": "string", "minLength": limit.repetition + 1}),
        _schema(
            "maxItems 10^9", {"type": "array", "items": {"type": "integer"}, "maxItems": 10**9}
        ),
        _schema(
            "minItems above maxItems", {"type": "array", "minItems": 5, "maxItems": 2, "items": {}}
        ),
        _schema("count as float", {"type": "string", "maxLength": 5.5}),
        _schema("count as bool", {"type": "string", "maxLength": True}),
        _schema("negative count", {"type": "string", "minLength": -5}),
        _schema("maxProperties huge", {"type": "object", "maxProperties": 10**6}),
        _schema("nested quantifiers", {"type": "string", "pattern": "^((a{100}){100}){100}$"}),
        _schema(
            "pattern groups 40 deep",
            {"type": "string", "pattern": "^" + "(" * 40 + "a" + ")" * 40 + "$"},
        ),
        _schema("pattern maximum below minimum", {"type": "string", "pattern": "^a{5,2}$"}),
        _schema(
            "pattern alternatives repeated", {"type": "string", "pattern": "^(a|bc|[d-f]){0,1000}$"}
        ),
        _schema("pattern with lone surrogate", '{"type":"string","pattern":"^\\ud800$"}'),
        _schema("pattern with NUL", '{"type":"string","pattern":"^a\\u0000b$"}'),
        _schema("recursive tree", tree),
        _schema(
            "left-recursive $ref",
            {
                "properties": {"x": {"$ref": "#/$defs/a"}},
                "$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "integer"}]}},
            },
        ),
        _schema(
            "$ref to itself",
            {"properties": {"x": {"$ref": "#/$defs/a"}}, "$defs": {"a": {"$ref": "#/$defs/a"}}},
        ),
        _schema(
            "$ref cycle with underscores", {"$ref": "#/$defs/node_x", "$defs": {"node_x": node}}
        ),
        _schema("$ref DAG 30 deep, underscores", _defs_chain(30, "d_")),
        _schema("$ref DAG 30 deep", _defs_chain(30, "d")),
        _schema(
            "$ref named like a primitive",
            {
                "properties": {"s": {"$ref": "#/$defs/string"}},
                "$defs": {
                    "string": {"type": "object", "properties": {"s": {"$ref": "#/$defs/string"}}}
                },
            },
        ),
        _schema("remote $ref", {"$ref": "https://example.com/schema.json"}),
        _schema("$ref to nowhere", {"properties": {"x": {"$ref": "#/$defs/none"}}}),
        _schema("enum of 6000", {"enum": [f"v{i}" for i in range(6000)]}),
        _schema("enum at the limit", {"enum": [f"name{i}" for i in range(limit.alternatives)]}),
        _schema("big const", {"const": {"k": ["x" * 100] * 300}}),
        _schema("JSON 100000 deep", "[" * 30_000 + "]" * 30_000),
        _schema("properties 400 deep", deep_properties),
        _schema("integer of 5000 digits", '{"enum":[' + "9" * 5000 + "]}"),
        _schema("NaN and Infinity", '{"enum":[NaN, Infinity, -Infinity]}'),
        _schema("not an object", "[1, 2, 3]"),
        _schema("items as a number", {"type": "array", "items": 5}),
        _schema(
            "900 optional properties",
            {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(900)}},
        ),
        _schema(
            "colliding property names",
            {"type": "object", "properties": {"a" + "_" * i: {"const": i} for i in range(200)}},
        ),
        _schema("prefixItems 3000", {"type": "array", "prefixItems": [{"type": "integer"}] * 3000}),
        _schema("anyOf 3000", {"anyOf": [{"const": i} for i in range(3000)]}),
        _schema(
            "allOf with refs",
            {
                "allOf": [{"$ref": "#/$defs/a"}, {"properties": {"b": {}}}],
                "$defs": {"a": {"properties": {"a": {}}}},
            },
        ),
        _schema("type list with junk", {"type": ["string", {"x": 1}, None]}),
        _schema("format of the wrong type", {"type": "string", "format": 5}),
        _schema("garbage", '{"type": "obj'),
    ]


# --- seeded random cases -------------------------------------------------------

_CHARS = string.ascii_letters + string.digits + ' -_\\"[]()|*+?{}.<>!#:=\n\t' + "éλ😀\u2028"


def random_cases(seed: int, count: int) -> list[HostileCase]:
    rng = random.Random(seed)
    cases = []
    for i in range(count):
        if rng.random() < 0.5:
            cases.append(_grammar(f"random grammar {seed}/{i}", random_grammar(rng)))
        else:
            cases.append(_schema(f"random schema {seed}/{i}", random_schema(rng)))
    return cases


def random_grammar(rng: random.Random) -> str:
    """A structured random GBNF grammar, amplified or mutated now and then."""
    names = ["root"] + [f"r{i}" for i in range(rng.randint(0, 6))]
    lines = [f"{name} ::= {_alternatives(rng, names, rng.randint(0, 4))}" for name in names]
    text = rng.choice(["\n", "\r\n", "\n\n# comment\n"]).join(lines)
    return _amplify(rng, _mutate(rng, text) if rng.random() < 0.3 else text)


def _alternatives(rng: random.Random, names: list[str], depth: int) -> str:
    count = rng.choice([1, 1, 2, 3, rng.randint(1, 50)])
    return " | ".join(_sequence(rng, names, depth) for _ in range(count))


def _sequence(rng: random.Random, names: list[str], depth: int) -> str:
    return " ".join(_item(rng, names, depth) + _quantifier(rng) for _ in range(rng.randint(0, 5)))


def _item(rng: random.Random, names: list[str], depth: int) -> str:
    kind = rng.randrange(8 if depth > 0 else 7)
    if kind == 0:
        return json.dumps("".join(rng.choice(_CHARS) for _ in range(rng.randint(0, 6))))
    if kind == 1:
        low, high = sorted(rng.choice(_CHARS[:62]) for _ in range(2))
        return rng.choice([f"[{low}-{high}]", f"[^{low}]", "[]", "[\\x00-\\x7F]", "[a-]"])
    if kind == 2:
        return rng.choice(["<think>", f"<[{rng.randint(0, 60_000)}]>", f"!<[{rng.randint(0, 9)}]>"])
    if kind == 3:
        return "."
    if kind in (4, 5, 6):
        return rng.choice([*names, "undefined-rule"])
    return f"({_alternatives(rng, names, depth - 1)})"


def _quantifier(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.6:
        return ""
    if roll < 0.8:
        return rng.choice("*+?")
    low = rng.choice([0, 1, 2, rng.randint(0, 50)])
    high = rng.choice([low, low + rng.randint(0, 20), None])
    if rng.random() < 0.1:  # hostile: large, or below the minimum
        low, high = rng.randint(0, 3000), rng.choice([rng.randint(0, 3000), low - 1])
    return f"{{{low}}}" if high == low else f"{{{low},{'' if high is None else high}}}"


def _mutate(rng: random.Random, text: str) -> str:
    """Garbage near a valid grammar: characters inserted, slices dropped or doubled."""
    for _ in range(rng.randint(1, 5)):
        at = rng.randrange(len(text) + 1)
        roll = rng.random()
        if roll < 0.4:
            text = text[:at] + rng.choice(_CHARS) + text[at:]
        elif roll < 0.7:
            text = text[:at] + text[at + rng.randint(1, 10) :]
        else:
            text = text[:at] + text[at : at + 20] * rng.randint(2, 50) + text[at:]
    return text


def _amplify(rng: random.Random, text: str) -> str:
    """Now and then, make a random grammar deep or long in one of the known ways."""
    roll = rng.random()
    if roll < 0.05:
        depth = rng.choice([GRAMMAR_LIMITS.nesting, GRAMMAR_LIMITS.nesting + 1, 3000])
        return f"{text}\nwrap ::= {'(' * depth}root{')' * depth}"
    if roll < 0.1:
        return f"{text}\nchain ::= " + " ".join(["root?"] * rng.randint(100, 3000))
    return text


def random_schema(rng: random.Random) -> str:
    """A random JSON schema, sometimes recursive through $defs, sometimes mutated."""
    defs = {
        f"d{i}" if rng.random() < 0.5 else f"d_{i}": _subschema(rng, 3)
        for i in range(rng.randint(0, 3))
    }
    schema = _subschema(rng, rng.randint(0, 4), list(defs))
    if defs and isinstance(schema, dict):
        schema["$defs"] = defs
    text = json.dumps(schema)
    return _mutate(rng, text) if rng.random() < 0.15 else text


def _subschema(rng: random.Random, depth: int, defs: list[str] | None = None) -> Any:
    defs = defs or []
    kind = rng.randrange(9 if depth > 0 else 5)
    if kind == 0:
        return {"type": "string", **_counts(rng, "minLength", "maxLength"), **_format(rng)}
    if kind == 1:
        return {"type": "string", "pattern": _pattern(rng)}
    if kind == 2:
        size = rng.choice([1, 3, 20, rng.randint(0, 1100)])
        values: list[Any] = [rng.choice([f"v{i}", i, None, True, 1.5]) for i in range(size)]
        return {"enum": values} if rng.random() < 0.8 else {"const": values}
    if kind == 3:
        return {
            "type": rng.choice(
                ["integer", "number", "boolean", "null", ["string", "null"], "quaternion"]
            )
        }
    if kind == 4 and defs:
        return {"$ref": f"#/$defs/{rng.choice(defs)}"}
    if kind == 4:
        return {}
    if kind == 5:
        props = {
            _property_name(rng): _subschema(rng, depth - 1, defs) for _ in range(rng.randint(0, 8))
        }
        required = [name for name in props if rng.random() < 0.5]
        extra: dict[str, Any] = rng.choice(
            [{}, {"additionalProperties": False}, {"additionalProperties": {"type": "integer"}}]
        )
        return {"type": "object", "properties": props, "required": required, **extra}
    if kind == 6:
        return {
            "type": "array",
            "items": _subschema(rng, depth - 1, defs),
            **_counts(rng, "minItems", "maxItems"),
        }
    if kind == 7:
        return {
            rng.choice(["anyOf", "oneOf", "allOf"]): [
                _subschema(rng, depth - 1, defs) for _ in range(rng.randint(1, 4))
            ]
        }
    return {
        "type": "array",
        "prefixItems": [_subschema(rng, depth - 1, defs) for _ in range(rng.randint(1, 3))],
    }


def _count(rng: random.Random) -> Any:
    return rng.choice([0, 1, 3, rng.randint(0, 20), rng.randint(0, 5000), 10**9, -1, 2.5, True])


def _counts(rng: random.Random, low: str, high: str) -> dict[str, Any]:
    return {key: _count(rng) for key in (low, high) if rng.random() < 0.5}


def _format(rng: random.Random) -> dict[str, Any]:
    return (
        {"format": rng.choice(["date", "time", "date-time", "uuid", "email", 7])}
        if rng.random() < 0.2
        else {}
    )


def _property_name(rng: random.Random) -> str:
    return rng.choice(
        ["name", "age", "a_b", "string", "root", "x-y", "é", "", "a b", f"p{rng.randint(0, 99)}"]
    )


def _pattern(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(1, 6)):
        atom = rng.choice(["a", "[a-z]", "\\d", ".", "(ab|c)", "\\.", '"', "é"])
        parts.append(
            atom
            + rng.choice(
                [
                    "",
                    "*",
                    "+",
                    "?",
                    f"{{{rng.randint(0, 3000)}}}",
                    f"{{{rng.randint(0, 9)},{rng.randint(0, 2000)}}}",
                ]
            )
        )
    body = "".join(parts)
    if rng.random() < 0.2:
        depth = rng.randint(1, 60)
        body = "(" * depth + body + ")" * depth
    return "^" + body + "$" if rng.random() < 0.9 else body


# --- a child process that runs every case -----------------------------------------


def main(argv: list[str] | None = None) -> None:
    """Run each case through resolve_grammar (and, accepted, a sampler with a vocabulary).

    One JSON line before and after each case, flushed, so that a parent sees
    which case a crash happened in:
        python -m tests.hostile_grammars --seed 1 --count 200 [--vocab MODEL.gguf]
    """
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--vocab", help="a GGUF model whose vocabulary builds the samplers")
    args = parser.parse_args(argv)
    start_sequence = _sequence_starter(args.vocab)
    for case in hostile_cases(args.seed, args.count):
        print(json.dumps({"start": case.name}), flush=True)
        print(
            json.dumps({"case": case.name, "outcome": _outcome(case, start_sequence)}), flush=True
        )


def _outcome(case: HostileCase, start_sequence: Any) -> str:
    from service.errors import InvalidRequest
    from service.grammar.compile import resolve_grammar

    try:
        gbnf = resolve_grammar(case.grammar, case.json_schema)
    except InvalidRequest:
        return "refused"
    except Exception as exc:  # what this run is for: anything else is a finding
        return f"raised {type(exc).__name__}: {str(exc)[:200]}"
    if gbnf is None or start_sequence is None:
        return "accepted"
    try:
        start_sequence(gbnf)
    except InvalidRequest:
        return "refused at sequence start"
    return "accepted"


def _sequence_starter(vocab_path: str | None) -> Any:
    """A function building and freeing the sampler chain a sequence starts with, or None."""
    if vocab_path is None:
        return None
    import llama_cpp

    from service.backends.llama_cpp.sampling import SamplerChain
    from service.text.requests import Grammar, SamplingParams

    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(vocab_path.encode(), params)
    vocab = llama_cpp.llama_model_get_vocab(model)
    greedy = SamplingParams(
        temperature=0.0, top_p=1.0, top_k=0, min_p=0.0, repeat_penalty=1.0, seed=1
    )

    def start(grammar: Grammar) -> None:
        SamplerChain(greedy, [], vocab, grammar).close()

    return start


if __name__ == "__main__":
    main()
