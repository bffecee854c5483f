"""GBNF for the integers between two bounds: JSON Schema's `minimum`/`maximum` on integers.

llama-cpp-python's schema converter writes any integer for `"type": "integer"`
whatever its bounds, so a tool argument declared `minimum: 1, maximum: 10`
could come back as 1000000000000000. llama.cpp's C++ converter bounds them; this
is our own version of that for the Python one.

A range of non-negative integers is written digit by digit: split by length
(no leading zeros), then, for numbers of one length, the usual decomposition of
a range of digit strings into prefixes followed by free digits. Negative
numbers are "-" followed by the mirrored range. Integers have at most
`MAX_DIGITS` digits, as the converter's own integer rule allows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

MAX_DIGITS = 16
LARGEST = 10**MAX_DIGITS - 1
BOUND_KEYWORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def integer_bounds(schema: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """The least and greatest integer `schema` allows (None: no bound on that side).

    Both JSON Schema spellings of exclusive bounds are read: a number (draft 6 and
    later) and a boolean beside `minimum`/`maximum` (draft 4). A bound past what
    an integer of `MAX_DIGITS` digits reaches is no bound."""
    low = _bound(schema, "minimum", "exclusiveMinimum", math.ceil, +1)
    high = _bound(schema, "maximum", "exclusiveMaximum", math.floor, -1)
    if (low is not None and low > LARGEST) or (high is not None and high < -LARGEST):
        raise ValueError(f"integers here have at most {MAX_DIGITS} digits")
    low = None if low is None or low < -LARGEST else low
    high = None if high is None or high > LARGEST else high
    if low is not None and high is not None and low > high:
        raise ValueError(f"no integer lies between the bounds {low} and {high}")
    return low, high


Rounding = Callable[[float], int]


def _bound(
    schema: Mapping[str, Any], inclusive: str, exclusive: str, rounding: Rounding, step: int
) -> int | None:
    """The tightest integer bound of one side; `step` moves off an exclusive one."""
    candidates: list[int] = []
    if inclusive in schema:
        value = _number(schema, inclusive)
        if schema.get(exclusive) is True:  # draft 4: the bound itself is excluded
            candidates.append(_past(value, rounding, step))
        else:
            candidates.append(rounding(value))
    if exclusive in schema and not isinstance(schema[exclusive], bool):
        candidates.append(_past(_number(schema, exclusive), rounding, step))
    if not candidates:
        return None
    return max(candidates) if step > 0 else min(candidates)


def _past(value: float, rounding: Rounding, step: int) -> int:
    """The first integer strictly beyond `value` on the side `step` points to."""
    rounded = int(rounding(value))
    return rounded + step if rounded == value else rounded


def _number(schema: Mapping[str, Any], keyword: str) -> float:
    value = schema[keyword]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{keyword} must be a finite number, not {value!r}")
    if isinstance(value, float) and not math.isfinite(value):  # json.loads reads NaN, Infinity
        raise TypeError(f"{keyword} must be a finite number, not {value!r}")
    return value


def integer_range_gbnf(low: int | None, high: int | None) -> str:
    """A GBNF expression matching exactly the integers from `low` to `high`, as JSON writes them."""
    alternatives: list[str] = []
    if low is None or low < 0:  # negative numbers: "-" and their magnitudes
        magnitude_high = None if low is None else -low
        magnitude_low = 1 if high is None else max(1, -high)
        if magnitude_high is None or magnitude_low <= magnitude_high:
            alternatives.append(f'"-" ({_naturals(magnitude_low, magnitude_high)})')
    start = 0 if low is None else max(0, low)
    if high is None or start <= high:
        alternatives.append(_naturals(start, high))
    return " | ".join(alternatives)


def _naturals(low: int, high: int | None) -> str:
    """Non-negative integers from `low` to `high` (None: up to `MAX_DIGITS` digits)."""
    low_length = len(str(low))
    high_length = MAX_DIGITS if high is None else len(str(high))
    if high is not None and low_length == high_length:
        return " | ".join(_same_length(str(low), str(high)))
    parts = _same_length(str(low), "9" * low_length)
    # Lengths strictly between (with no upper bound, up to the longest): any such number.
    longest = high_length if high is None else high_length - 1
    if low_length < longest:
        parts.append(f"[1-9] {_digits(low_length, longest - 1)}")
    if high is not None:
        parts.extend(_same_length("1" + "0" * (high_length - 1), str(high)))
    return " | ".join(parts)


def _same_length(low: str, high: str) -> list[str]:
    """Alternatives matching the digit strings from `low` to `high`, both of one length."""
    if low == high:
        return [f'"{low}"']
    if len(low) == 1:
        return [_digit_class(low, high)]
    if low[0] == high[0]:
        return [f'"{low[0]}" ({alternative})' for alternative in _grouped(low[1:], high[1:])]
    rest = len(low) - 1
    parts: list[str] = []
    middle_low, middle_high = int(low[0]) + 1, int(high[0]) - 1
    if low[1:] == "0" * rest:
        middle_low -= 1  # the whole block under low[0] is in range: join it to the middle
    else:
        parts.extend(f'"{low[0]}" ({tail})' for tail in _grouped(low[1:], "9" * rest))
    if high[1:] == "9" * rest:
        middle_high += 1
    if middle_low <= middle_high:
        parts.append(f"{_digit_class(str(middle_low), str(middle_high))} {_digits(rest, rest)}")
    if high[1:] != "9" * rest:
        parts.extend(f'"{high[0]}" ({tail})' for tail in _grouped("0" * rest, high[1:]))
    return parts


def _grouped(low: str, high: str) -> list[str]:
    """`_same_length` as one alternative list, for use after a fixed leading digit."""
    return [" | ".join(_same_length(low, high))]


def _digit_class(low: str, high: str) -> str:
    return f'"{low}"' if low == high else f"[{low}-{high}]"


def _digits(low: int, high: int) -> str:
    """From `low` to `high` free digits."""
    if high == 0:
        return ""
    if low == high:
        return "[0-9]" if low == 1 else f"[0-9]{{{low}}}"
    return f"[0-9]{{{low},{high}}}"
