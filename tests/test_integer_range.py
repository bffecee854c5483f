"""Integer bounds in JSON schemas become grammars that accept exactly the integers in range."""

from __future__ import annotations

import json
import re

import pytest

from service.errors import InvalidRequest
from service.grammar.compile import check_grammar, grammar_from_json_schema
from service.grammar.integer_range import MAX_DIGITS, integer_bounds, integer_range_gbnf

# GBNF's literals, classes, groups, alternatives and counts, as a Python regex:
# the oracle the brute-force tests read the expressions with.
_LITERAL = re.compile(r'"([^"]*)"')


def as_regex(gbnf: str) -> re.Pattern[str]:
    pattern = _LITERAL.sub(lambda m: re.escape(m.group(1)), gbnf).replace(" ", "")
    return re.compile(f"(?:{pattern})")


def accepted(low: int | None, high: int | None, candidates: range) -> list[int]:
    regex = as_regex(integer_range_gbnf(low, high))
    return [n for n in candidates if regex.fullmatch(json.dumps(n))]


RANGES = [
    (0, 0), (0, 9), (1, 10), (0, 150), (7, 7), (19, 21), (99, 101), (123, 4567), (100, 999),
    (1000, 1000), (-20, 35), (-150, -3), (-9, -1), (-1, 0), (-1000, 1000),
]  # fmt: skip


@pytest.mark.parametrize(("low", "high"), RANGES)
def test_exactly_the_integers_in_range_are_accepted(low: int, high: int) -> None:
    candidates = range(-2000, 6000)
    assert accepted(low, high, candidates) == list(range(low, high + 1))


@pytest.mark.parametrize(("low", "high"), [(5, None), (None, -3), (None, 99), (-40, None)])
def test_an_open_side_reaches_the_longest_integer(low: int | None, high: int | None) -> None:
    candidates = range(-3000, 3000)
    assert accepted(low, high, candidates) == [
        n for n in candidates if (low is None or n >= low) and (high is None or n <= high)
    ]
    regex = as_regex(integer_range_gbnf(low, high))
    largest = "9" * MAX_DIGITS
    assert bool(regex.fullmatch(largest)) == (high is None)
    assert bool(regex.fullmatch("-" + largest)) == (low is None)
    assert not regex.fullmatch("1" + largest)  # one digit more than integers may have


def test_no_leading_zeros_or_negative_zero() -> None:
    regex = as_regex(integer_range_gbnf(-100, 100))
    assert not any(regex.fullmatch(text) for text in ("01", "007", "-0", "-05", "+5", ""))


@pytest.mark.parametrize(
    ("schema", "bounds"),
    [
        ({"minimum": 1, "maximum": 10}, (1, 10)),
        ({"exclusiveMinimum": 1, "exclusiveMaximum": 10}, (2, 9)),  # draft 6 and later
        ({"minimum": 1, "exclusiveMinimum": True, "maximum": 10}, (2, 10)),  # draft 4
        ({"minimum": 1, "exclusiveMinimum": False}, (1, None)),
        ({"minimum": 0.5, "maximum": 9.5}, (1, 9)),
        ({"exclusiveMinimum": 0.5, "exclusiveMaximum": 9.5}, (1, 9)),
        ({"minimum": 3, "exclusiveMinimum": 5}, (6, None)),  # the tighter of the two
        ({"maximum": 1e30}, (None, None)),  # past what an integer here reaches: no bound
        ({"minimum": -1e30, "maximum": -1}, (None, -1)),
        ({"maximum": 10**400}, (None, None)),  # too large for a float, still a JSON number
    ],
)
def test_bounds_are_read_as_json_schema_means_them(
    schema: dict[str, object], bounds: tuple[int | None, int | None]
) -> None:
    assert integer_bounds(schema) == bounds


@pytest.mark.parametrize(
    ("schema", "reason"),
    [
        ({"type": "integer", "minimum": 10, "maximum": 1}, "no integer lies between"),
        ({"type": "integer", "exclusiveMinimum": 3, "exclusiveMaximum": 4}, "no integer lies"),
        ({"type": "integer", "minimum": "1"}, "minimum must be a finite number"),
        ({"type": "integer", "maximum": True}, "maximum must be a finite number"),
        ({"type": "integer", "minimum": 1e17}, f"at most {MAX_DIGITS} digits"),
        ({"type": "integer", "minimum": 10**400}, f"at most {MAX_DIGITS} digits"),
    ],
)
def test_impossible_or_malformed_bounds_are_refused(schema: object, reason: str) -> None:
    with pytest.raises(InvalidRequest, match=reason):
        grammar_from_json_schema(json.dumps(schema))


def test_a_schema_s_bounded_integers_reach_its_grammar() -> None:
    schema = {
        "type": "object",
        "properties": {
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "count": {"type": ["integer", "null"], "exclusiveMinimum": 0, "maximum": 20},
        },
    }
    gbnf = grammar_from_json_schema(json.dumps(schema))
    check_grammar(gbnf)  # llama.cpp's own parser takes it
    rules = dict(line.split(" ::= ", 1) for line in gbnf.splitlines())
    assert rules["age"] == f"({integer_range_gbnf(0, 150)}) space"
    assert f"({integer_range_gbnf(1, 20)}) space" in rules.values()
    assert "null" in rules["count"]


def test_an_integer_in_an_enum_or_const_is_left_to_them() -> None:
    gbnf = grammar_from_json_schema(json.dumps({"type": "integer", "enum": [3, 40], "minimum": 1}))
    assert '"3"' in gbnf
    assert '"40"' in gbnf
    assert "[0-9]" not in gbnf
