"""Bounds on a JSON schema, checked on the schema before the converter runs.

llama-cpp-python's converter writes what a schema asks for without limit:
`maxLength: 100000` becomes a hundred thousand optional repetitions, and a
pattern's `{0,100000}` the same, before any check on its output could act. So
the schema itself is read first, without recursion: the nesting of its JSON
(before `json.loads`, whose C parser recurses), then every subschema the
converter would visit, following local `$ref`s (each once: cycles are legal
recursion in JSON Schema), with each count keyword, enum and pattern bounded.
Messages name the keyword and where it is, as a JSON pointer.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from service.errors import InvalidRequest, excerpt
from service.grammar.grammar_limits import SchemaLimits, limit_exceeded

WHAT = "`response_format.json_schema`"

# Count keywords, as (minimum, maximum) pairs: none may pass the repetition limit.
COUNT_PAIRS = (
    ("minLength", "maxLength"),
    ("minItems", "maxItems"),
    ("minProperties", "maxProperties"),
    ("minContains", "maxContains"),
)
# Keywords whose value is a subschema, a list of them, or a name -> subschema map.
# Values of enum, const, default and examples are data, never walked.
_ONE = ("items", "additionalProperties", "additionalItems", "contains", "not", "if", "then",
        "else", "propertyNames", "unevaluatedItems", "unevaluatedProperties")  # fmt: skip
_LIST = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")

_JSON_SYNTAX = re.compile(r'"(?:[^"\\]++|\\.)*+"|[\[\]{}]')


def check_json_depth(text: str, limits: SchemaLimits) -> None:
    """Refuse JSON nested deeper than the limit, without parsing it (strings skipped)."""
    depth = 0
    for token in _JSON_SYNTAX.finditer(text):
        char = token.group()[0]
        if char in "[{":
            depth += 1
            if depth > limits.depth:
                subject = f"the nesting of its JSON at character {token.start()}"
                raise limit_exceeded(WHAT, subject, limits.depth, "levels")
        elif char in "]}":
            depth -= 1


def check_schema(schema: dict[str, Any], limits: SchemaLimits) -> None:
    """Refuse a schema whose counts, enums, patterns or size cross a limit."""
    for count, (node, pointer) in enumerate(_subschemas(schema), start=1):
        if count > limits.nodes:
            raise limit_exceeded(WHAT, "its number of subschemas", limits.nodes, "subschemas")
        _check_node(node, pointer or "/", limits)
        _check_merged_properties(schema, node, pointer or "/", limits)


def _subschemas(root: dict[str, Any]) -> Iterator[tuple[dict[str, Any], str]]:
    """Every subschema with its JSON pointer, each once, $ref targets included."""
    seen: set[int] = set()
    todo: list[tuple[Any, str]] = [(root, "")]
    while todo:
        node, pointer = todo.pop()
        if not isinstance(node, dict) or id(node) in seen:
            continue
        seen.add(id(node))
        yield node, pointer
        todo.extend(_children(node, pointer))
        target = _ref_target(root, node.get("$ref"))
        if target is not None:
            todo.append(target)


def _children(node: dict[str, Any], pointer: str) -> Iterator[tuple[Any, str]]:
    for key in _ONE:
        if isinstance(node.get(key), dict):
            yield node[key], f"{pointer}/{key}"
    for key in _LIST:
        if isinstance(node.get(key), list):
            yield from ((item, f"{pointer}/{key}/{i}") for i, item in enumerate(node[key]))
    for key in _MAP:
        if isinstance(node.get(key), dict):
            yield from ((item, f"{pointer}/{key}/{name}") for name, item in node[key].items())


def _ref_target(root: dict[str, Any], ref: object) -> tuple[Any, str] | None:
    """A local `$ref`'s target, resolved as the converter resolves it; None if it cannot be."""
    if not isinstance(ref, str) or not ref.startswith("#/"):
        return None
    target: Any = root
    for step in ref[2:].split("/"):
        if not isinstance(target, dict) or step not in target:
            return None
        target = target[step]
    return target, ref[1:]


def _check_node(node: dict[str, Any], pointer: str, limits: SchemaLimits) -> None:
    for low_key, high_key in COUNT_PAIRS:
        low = _count(node, low_key, pointer, limits)
        high = _count(node, high_key, pointer, limits)
        if low is not None and high is not None and high < low:
            raise InvalidRequest(
                f"{WHAT}: {high_key} {high} is below {low_key} {low} at {excerpt(pointer)}; "
                "no document could match"
            )
    for key in ("enum", "anyOf", "oneOf"):
        choices = node.get(key)
        if isinstance(choices, list) and len(choices) > limits.alternatives:
            subject = f"{key} of {len(choices)} alternatives at {excerpt(pointer)}"
            raise limit_exceeded(WHAT, subject, limits.alternatives, "alternatives")
    properties = node.get("properties")
    if isinstance(properties, dict) and len(properties) > limits.properties:
        subject = f"an object of {len(properties)} properties at {excerpt(pointer)}"
        raise limit_exceeded(WHAT, subject, limits.properties, "properties")
    if isinstance(node.get("pattern"), str):
        _check_pattern(node["pattern"], pointer, limits)


def _check_merged_properties(
    root: dict[str, Any], node: dict[str, Any], pointer: str, limits: SchemaLimits
) -> None:
    """An allOf makes one object of its parts' properties (and of their anyOf's): bound them too."""
    parts = node.get("allOf")
    if not isinstance(parts, list):
        return
    merged = 0
    for part in parts:
        choices = part.get("anyOf") if isinstance(part, dict) else None
        for item in choices if isinstance(choices, list) else [part]:
            target = _ref_target(root, item.get("$ref")) if isinstance(item, dict) else None
            schema = target[0] if target else item
            properties = schema.get("properties") if isinstance(schema, dict) else None
            merged += len(properties) if isinstance(properties, dict) else 0
    if merged > limits.properties:
        subject = f"the allOf of {merged} properties at {excerpt(pointer)}"
        raise limit_exceeded(WHAT, subject, limits.properties, "properties")


def _count(node: dict[str, Any], key: str, pointer: str, limits: SchemaLimits) -> int | None:
    if key not in node:
        return None
    value = node[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidRequest(
            f"{WHAT}: {key} at {excerpt(pointer)} must be a non-negative integer, "
            f"not {excerpt(repr(value))}"
        )
    if value > limits.repetition:
        subject = f"{key} {value} at {excerpt(pointer)}"
        raise limit_exceeded(WHAT, subject, limits.repetition, "repetitions")
    return value


_PATTERN_TOKEN = re.compile(r"\\.|\[(?:\\.|[^\]\\])*\]?|\{[^}]*\}?|[()]", re.DOTALL)


def _check_pattern(pattern: str, pointer: str, limits: SchemaLimits) -> None:
    """Bound a pattern's group nesting and its `{m,n}` counts, read as the converter reads them."""
    where = f"the pattern at {excerpt(pointer)}"
    depth = 0
    for token in _PATTERN_TOKEN.finditer(pattern):
        text = token.group()
        if text == "(":
            depth += 1
            if depth > limits.pattern_nesting:
                raise limit_exceeded(
                    WHAT, f"the nesting of {where}", limits.pattern_nesting, "levels"
                )
        elif text == ")":
            depth -= 1
        elif text.startswith("{") and text.endswith("}"):
            _check_quantifier(text, where, limits)


def _check_quantifier(quantifier: str, where: str, limits: SchemaLimits) -> None:
    parts = [part.strip() for part in quantifier[1:-1].split(",")]
    if len(parts) > 2 or not all(part.isdigit() for part in parts if part):
        return  # the converter refuses it with its own reason
    if any(len(part) > 9 for part in parts):
        raise limit_exceeded(
            WHAT, f"{excerpt(quantifier)} in {where}", limits.repetition, "repetitions"
        )
    low = int(parts[0] or 0)
    high = int(parts[-1]) if parts[-1] else None
    if max(low, high or 0) > limits.repetition:
        raise limit_exceeded(
            WHAT, f"{excerpt(quantifier)} in {where}", limits.repetition, "repetitions"
        )
    if high is not None and high < low:
        raise InvalidRequest(
            f"{WHAT}: {excerpt(quantifier)} in {where} has a maximum below its minimum"
        )
