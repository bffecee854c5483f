"""JSON Schema to GBNF: llama-cpp-python's converter, its work bounded and four faults fixed.

The converter (`llama_cpp.llama_grammar.SchemaConverter`, a port of llama.cpp's
json_schema_to_grammar.py) is used through a subclass; llama-cpp-python's
module is not changed, for this server or any other caller. The subclass:

- writes repetitions with GBNF's `{m,n}`, which llama.cpp expands into a chain
  of rules, where upstream nests one optional group inside the next:
  `maxLength: 500` was 500 levels of parentheses, each a native stack frame in
  llama.cpp's parser, and 100000 of them crashed it;
- resolves each `$ref` once, into a rule of its own: upstream visits a
  definition again at every reference when its name holds a character it
  escapes (`node_a`), which is exponential along a chain of definitions, and
  inside a cycle it refers to the unescaped name, or to a built-in rule of the
  same name (`string`, `object`);
- names rules in constant time, where upstream searches for a free name,
  quadratic in names that escape alike;
- counts the subschemas it visits, and how deep it is, and stops past the limits;
- bounds integers by `minimum`, `maximum` and their exclusive forms
  (`integer_range`), which upstream leaves unenforced, also where `type` is a
  list (upstream drops every keyword but `type` there).

Upstream's own `visit` and `_visit_pattern` do the converting: they are
re-bound to a namespace where `_build_repetition` is this module's.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

from llama_cpp.llama_grammar import INVALID_RULE_CHARS_RE, RESERVED_NAMES, SchemaConverter

from service.grammar.grammar_limits import SchemaLimits, limit_exceeded
from service.grammar.integer_range import BOUND_KEYWORDS, integer_bounds, integer_range_gbnf
from service.grammar.schema_limits import WHAT


def schema_to_gbnf(schema: dict[str, Any], limits: SchemaLimits) -> str:
    """GBNF accepting what `schema` accepts; it is changed in place (its $refs resolved)."""
    converter = BoundedSchemaConverter(limits)
    converter.visit(converter.resolve_refs(schema, "stdin"), "")
    return str(converter.format_grammar())  # type: ignore[no-untyped-call]


def _with_globals(function: Callable[..., Any], **names: object) -> Callable[..., Any]:
    """`function` with some of its module's global names bound to other objects."""
    code = function.__code__
    namespace = {**function.__globals__, **names}
    return types.FunctionType(code, namespace, code.co_name, function.__defaults__)


class BoundedSchemaConverter(SchemaConverter):
    def __init__(self, limits: SchemaLimits) -> None:
        super().__init__(  # type: ignore[no-untyped-call]
            prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False
        )
        self._limits = limits
        self._visits = 0
        self._depth = 0
        self._ref_rules: dict[str, str] = {}
        self._names: dict[tuple[str, str], str] = {}
        self._next_suffix: dict[str, int] = {}
        ours = {"_build_repetition": self._repetition}
        self._upstream_visit = types.MethodType(_with_globals(SchemaConverter.visit, **ours), self)
        self._upstream_pattern = types.MethodType(
            _with_globals(SchemaConverter._visit_pattern, **ours), self
        )

    def visit(self, schema: Any, name: str) -> str:
        self._visits += 1
        if self._visits > self._limits.nodes:
            raise limit_exceeded(
                WHAT,
                "the subschemas it makes the converter visit",
                self._limits.nodes,
                "subschemas",
            )
        self._depth += 1
        try:
            if self._depth > self._limits.depth:
                raise limit_exceeded(
                    WHAT, "the nesting of its subschemas and $refs", self._limits.depth, "levels"
                )
            if _bounded_integers(schema):
                return self._bounded_integer(schema, name)
            if _bounded_type_list(schema):
                return self._upstream_union_of_types(schema, name)
            return str(self._upstream_visit(schema, name))
        finally:
            self._depth -= 1

    def _bounded_integer(self, schema: dict[str, Any], name: str) -> str:
        low, high = integer_bounds(schema)
        if low is None and high is None:  # bounds past 16 digits: the converter's own rule
            return str(self._upstream_visit({"type": "integer"}, name))
        return self._add_rule(_rule_name(name), f"({integer_range_gbnf(low, high)}) space")

    def _upstream_union_of_types(self, schema: dict[str, Any], name: str) -> str:
        """`type: [..]` as upstream writes it, each type keeping the schema's bounds."""
        bounds = {key: schema[key] for key in BOUND_KEYWORDS if key in schema}
        alternatives = [{"type": kind, **bounds} for kind in schema["type"]]
        union = self._generate_union_rule(name, alternatives)  # type: ignore[no-untyped-call]
        return self._add_rule(_rule_name(name), str(union))

    def _visit_pattern(self, pattern: str, name: str) -> str:
        return str(self._upstream_pattern(pattern, name))

    def _add_rule(self, name: str, rule: str) -> str:
        """Upstream's naming (the escaped name, else the first free name0, name1...), in O(1)."""
        escaped = INVALID_RULE_CHARS_RE.sub("-", name)
        if self._rules.get(escaped, rule) == rule:
            key = escaped
        else:
            key = self._names.get((escaped, rule)) or self._free_name(escaped)
        self._rules[key] = rule
        self._names[(escaped, rule)] = key
        return key

    def _free_name(self, escaped: str) -> str:
        suffix = self._next_suffix.get(escaped, 0)
        while f"{escaped}{suffix}" in self._rules:
            suffix += 1
        self._next_suffix[escaped] = suffix + 1
        return f"{escaped}{suffix}"

    def _resolve_ref(self, ref: str) -> str:
        """A rule standing for the $ref's target, converted once; a cycle refers to it by name."""
        key = self._ref_rules.get(ref)
        if key is None:
            target = self._refs[ref]  # an unknown ref is a KeyError, as upstream
            base = ref.split("/")[-1]
            key = self._add_rule(f"{base}-ref", f"\0pending {ref}")  # reserved until converted
            self._ref_rules[ref] = key
            self._rules[key] = self.visit(target, base)
        return key

    def _repetition(
        self,
        item_rule: str,
        min_items: int,
        max_items: int | None,
        separator_rule: str | None = None,
        item_rule_is_literal: bool = False,
    ) -> str:
        """Upstream's `_build_repetition`: the same language, with GBNF repetitions, not nesting."""
        del item_rule_is_literal  # `"a"{3}` says what upstream's `"aaa"` says
        if not isinstance(min_items, int) or not isinstance(max_items, int | None):
            raise TypeError(f"counts must be integers, not {min_items!r} and {max_items!r}")
        if min_items < 0 or (max_items is not None and max_items < min_items):
            raise ValueError(f"no count from {min_items} to {max_items}")
        if not separator_rule:
            return _repeat(item_rule, min_items, max_items)
        rest = self._add_rule(f"{item_rule}-rest", f"{separator_rule} {item_rule}")
        more = None if max_items is None else max_items - 1
        if min_items > 0:
            return f"{item_rule} {_repeat(rest, min_items - 1, more)}".rstrip()
        if max_items == 0:
            return ""
        return f"({item_rule} {_repeat(rest, 0, more)})?".replace(" )", ")")


def _rule_name(name: str) -> str:
    """The rule name upstream's `visit` gives a subschema called `name`."""
    return name + "-" if name in RESERVED_NAMES else name or "root"


# Keywords upstream's `visit` acts on before it reaches a schema's `type`.
_TAKEN_FIRST = ("$ref", "oneOf", "anyOf", "const", "enum")


def _bounded_integers(schema: Any) -> bool:
    """An integer schema with bounds, which upstream would write as any integer."""
    return (
        isinstance(schema, dict)
        and schema.get("type") == "integer"
        and any(key in schema for key in BOUND_KEYWORDS)
        and not any(key in schema for key in _TAKEN_FIRST)
    )


def _bounded_type_list(schema: Any) -> bool:
    """`type: [...]` beside bounds, which upstream would drop."""
    return (
        isinstance(schema, dict)
        and isinstance(schema.get("type"), list)
        and any(key in schema for key in BOUND_KEYWORDS)
        and not any(key in schema for key in ("$ref", "oneOf", "anyOf"))
    )


def _repeat(symbol: str, low: int, high: int | None) -> str:
    """`symbol` repeated from `low` to `high` times (None: no bound), spelled shortest."""
    if high is None:
        return {0: f"{symbol}*", 1: f"{symbol}+"}.get(low, f"{symbol}{{{low},}}")
    if high == 0:
        return ""
    if low == high:
        return symbol if low == 1 else f"{symbol}{{{low}}}"
    if (low, high) == (0, 1):
        return f"{symbol}?"
    return f"{symbol}{{{low},{high}}}"
