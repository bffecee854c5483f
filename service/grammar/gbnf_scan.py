"""llama.cpp's GBNF parser, re-done in Python without recursion, counting what it builds.

It reads the same tokens as llama-grammar.cpp, expands repetitions into the
same copies and synthesized rules, and stops before anything is built past a
limit. The result is the rule structure, compact: an alternative is a list of
items, a rule id (>= 0) or a run of terminal elements (characters, ranges,
tokens) as minus its element count. Syntax errors are refused here, worded as
llama.cpp words them, so llama.cpp only ever parses text read here to the end.
Two refusals are this server's own: a comment inside `{m,n}` (llama.cpp skips
it; nobody writes one), and a literal or class no model can write (llama.cpp
accepts it, then aborts the process when sampling reaches it).

One regular expression cuts the text into tokens, each with the spaces and
comments after it, in C; the loop over tokens is the only Python per element.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import NoReturn

from service.errors import InvalidRequest, excerpt
from service.grammar.grammar_limits import GrammarLimits, limit_exceeded

# llama.cpp's ceiling on a `{m,n}` count (MAX_REPETITION_THRESHOLD): it refuses a
# larger minimum, treats a larger maximum as unbounded, and refuses when the rules
# under a repetition times its count pass it.
LLAMA_REPETITION_THRESHOLD = 2000

_ESCAPE = r"\\(?:x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|[trn\\\"\[\]\-])"
_SPACE = r"[ \t]*+(?:#[^\r\n]*+[ \t]*+)*+"
_TOKENS = re.compile(
    "(?:"
    r"(?P<name>[a-zA-Z0-9-]++)"
    rf'|(?P<literal>"(?:[^"\\]++|{_ESCAPE})*+")'
    rf"|(?P<chars>\[\^?(?:[^\]\\]++|{_ESCAPE})*+\])"
    r"|(?P<token>!?<(?:\[[0-9]++\]|(?!\[)[^>]*+)>)"
    r"|(?P<dot>\.)"
    r"|(?P<op>[*+?])"
    r"|(?P<counts>\{[0-9 \t\r\n,]*+\})"
    r"|(?P<open>\()"
    r"|(?P<close>\))"
    r"|(?P<bar>\|)"
    r"|(?P<define>::=)"
    r"|(?P<newline>\r\n|\r|\n)"
    r"|(?P<space>[ \t]|#[^\r\n]*+)"
    r"|(?P<bad>[\s\S])"
    ")" + _SPACE
)
_ESCAPES = re.compile(_ESCAPE)
_UNITS = re.compile(_ESCAPE + r"|[\s\S]")
_HEX_SIZE = {"x": 2, "u": 4, "U": 8}
_HEX = frozenset("0123456789abcdefABCDEF")
_SIMPLE_ESCAPES = frozenset('tnr\\"[]-')
# Where llama.cpp goes on past a newline: after these, and anywhere inside parentheses.
_NEWLINE_OK_AFTER = frozenset({"define", "bar", "open", "newline", "space", None})
_OPERATORS = {"*": (0, None), "+": (1, None), "?": (0, 1)}


@dataclass
class ParsedGrammar:
    """The rules as llama.cpp would build them, indexed by llama.cpp's rule ids."""

    names: list[str]  # a synthesized rule's is its base and `_`: see name()
    rules: list[list[list[int]] | None]  # None: referenced, never defined
    elements: int

    def name(self, rule_id: int) -> str:
        """The rule's name as llama.cpp gives it (base_N for a synthesized rule)."""
        name = self.names[rule_id]
        return f"{name}{rule_id}" if name.endswith("_") else name

    def complete(self) -> bool:
        """Every referenced rule is defined and there is a `root`: else llama.cpp refuses it."""
        return "root" in self.names and all(rule is not None for rule in self.rules)

    def size(self, rule_id: int) -> int:
        alts = self.rules[rule_id] or []
        return len(alts) + sum(1 if item >= 0 else -item for alt in alts for item in alt)


@dataclass
class _Frame:
    """A rule being parsed: a named rule, or a parenthesised group inside one."""

    rule_id: int
    base: str  # the named rule's name, from which llama.cpp names synthesized rules
    nested: bool
    symbols_before: int = 0
    alts: list[list[int]] = field(default_factory=list)
    alt: list[int] = field(default_factory=list)
    last: int = 0  # where the item a repetition applies to starts in `alt`
    n_prev: int = 1  # llama.cpp's count of the rules under that item


def parse_gbnf(text: str, what: str, limits: GrammarLimits) -> ParsedGrammar:
    """The rules llama.cpp would build from `text`; InvalidRequest past a limit or on bad syntax."""
    return _Parser(text, what, limits).parse()


class _Parser:
    def __init__(self, text: str, what: str, limits: GrammarLimits) -> None:
        self.text = text
        self.what = what
        self.limits = limits
        self.symbols: dict[str, int] = {}
        self.names: list[str] = []
        self.rules: list[list[list[int]] | None] = []
        self.elements = 0

    def parse(self) -> ParsedGrammar:
        frames: list[_Frame] = []
        previous: str | None = None
        pending: str | None = None  # a rule's name, waiting for its ::=
        for match in _TOKENS.finditer(self.text):
            kind, pos = match.lastgroup, match.start()
            if not frames:  # between rules: a name, then ::=
                pending = self._rule_start(kind, match, pending, frames)
            elif kind == "newline" and not (frames[-1].nested or previous in _NEWLINE_OK_AFTER):
                self._end_rule(frames, pos)
            elif kind not in ("newline", "space"):
                self._token(kind, match, frames)
            previous = kind
        if frames:
            self._end_rule(frames, len(self.text))
        elif pending is not None:
            self._syntax("expecting ::= at", len(self.text))
        return ParsedGrammar(self.names, self.rules, self.elements)

    def _rule_start(
        self, kind: str | None, match: re.Match[str], pending: str | None, frames: list[_Frame]
    ) -> str | None:
        """Between rules: skip blank lines, read a name, then its ::= opens the rule."""
        if kind in ("newline", "space") and pending is None:
            return None
        if pending is None:
            if kind != "name":
                self._syntax("expecting name at", match.start())
            return match.group(kind)
        if kind != "define":
            self._syntax("expecting ::= at", match.start())
        frames.append(_Frame(self._symbol(pending), pending, nested=False))
        return None

    def _end_rule(self, frames: list[_Frame], pos: int) -> None:
        if len(frames) > 1:
            self._syntax("expecting ')' at", pos)
        self._finish(frames.pop())

    def _token(self, kind: str | None, match: re.Match[str], frames: list[_Frame]) -> None:
        frame, pos = frames[-1], match.start()
        if kind == "name":
            self._item(frame, self._symbol(match.group(kind)), 1)
        elif kind in ("literal", "chars"):
            body = match.group(kind)
            units = len(_ESCAPES.sub("e", body)) if "\\" in body else len(body)
            if ("\\" in body or "-" in body) and _matches_nothing(body):
                self._dead(body, pos)
            self._item(frame, None, units - 2 - (body.startswith("[^")))
        elif kind in ("token", "dot"):
            self._check_token(match.group(kind), pos)
            self._item(frame, None, 1)
        elif kind == "op":
            low, high = _OPERATORS[match.group(kind)[0]]
            self._expand(frame, low, high, pos)
        elif kind == "counts":
            self._counts(frame, match.group(kind), pos)
        elif kind == "open":
            self._open(frames, pos)
        elif kind == "close":
            self._close(frames, pos)
        elif kind == "bar":
            self._add_elements(1)
            frame.alts.append(frame.alt)
            frame.alt, frame.last, frame.n_prev = [], 0, 1
        else:
            self._bad(frames, pos)

    def _item(self, frame: _Frame, rule_id: int | None, count: int) -> None:
        frame.last, frame.n_prev = len(frame.alt), 1
        if rule_id is not None:
            frame.alt.append(rule_id)
            self._add_elements(1)
        elif count > 0:  # an empty literal or class adds nothing
            frame.alt.append(-count)
            self._add_elements(count)

    def _open(self, frames: list[_Frame], pos: int) -> None:
        if len(frames) > self.limits.nesting:
            self._over("the nesting of parentheses", pos, self.limits.nesting, "levels")
        base, before = frames[-1].base, len(self.names)  # llama.cpp counts before naming it
        frames.append(_Frame(self._generated(base), base, True, before))

    def _close(self, frames: list[_Frame], pos: int) -> None:
        if len(frames) == 1:
            self._syntax("expecting newline or end at", pos)
        group = frames.pop()
        self._finish(group)
        parent = frames[-1]
        parent.n_prev = max(1, len(self.names) - group.symbols_before)
        parent.last = len(parent.alt)
        parent.alt.append(group.rule_id)
        self._add_elements(1)

    def _finish(self, frame: _Frame) -> None:
        frame.alts.append(frame.alt)
        self._add_elements(1)  # END
        self.rules[frame.rule_id] = frame.alts

    def _check_token(self, token: str, pos: int) -> None:
        if token.startswith(("<[", "!<[")):
            digits = token[token.index("[") + 1 : -2]
            if len(digits) > 10 or int(digits) >= 2**32:
                self._syntax("parsed token id is too big at", pos)

    def _counts(self, frame: _Frame, spec: str, pos: int) -> None:
        """`{m}`, `{m,}` or `{m,n}`, with the spaces llama.cpp allows inside."""
        if not frame.nested and ("\n" in spec or "\r" in spec):
            self._syntax("expecting '}' at", pos)
        parts = [part.strip(" \t\r\n") for part in spec[1:-1].split(",")]
        if len(parts) > 2 or not all(part.isdigit() for part in parts if part) or not parts[0]:
            self._syntax("expecting an int at", pos)
        if max(len(part) for part in parts) > 9:  # past any limit; int() would be slow
            self._over(excerpt(spec), pos, self.limits.repetition, "repetitions")
        low = int(parts[0])
        high = low if len(parts) == 1 else (int(parts[1]) if parts[1] else None)
        if max(low, high or 0) > self.limits.repetition:
            self._over(excerpt(spec), pos, self.limits.repetition, "repetitions")
        if high is not None and high < low:
            # llama.cpp counts the optional copies as high - low, unsigned: a loop
            # adding rules until memory runs out.
            self._syntax(f"{excerpt(spec)} has a maximum below its minimum", pos)
        if low > LLAMA_REPETITION_THRESHOLD:
            self._syntax("number of repetitions exceeds sane defaults at", pos)
        if high is not None and high > LLAMA_REPETITION_THRESHOLD:
            high = None  # what llama.cpp does with a larger maximum
        self._expand(frame, low, high, pos)

    def _expand(self, frame: _Frame, low: int, high: int | None, pos: int) -> None:
        """llama.cpp's handle_repetitions: S{m,n} is m copies of S and n - m chained rules."""
        if frame.last == len(frame.alt):
            self._syntax("expecting preceding item to */+/?/{ at", pos)
        prev = frame.alt[frame.last :]
        weight = sum(1 if item >= 0 else -item for item in prev)
        total = high if high else (low or 1)
        if frame.n_prev * total > LLAMA_REPETITION_THRESHOLD:
            self._syntax(
                "number of rules that are going to be repeated multiplied by the new "
                "repetition exceeds sane defaults at",
                pos,
            )
        optional = 1 if high is None else high - low
        self._reserve(optional, (low - 1) * weight + optional * (weight + 3) + 1, pos)
        if low == 0:
            del frame.alt[frame.last :]
        frame.alt.extend(prev * (low - 1))
        # The chained rules S'(k) ::= S S'(k-1) | (empty), written straight into the
        # tables: a repetition can add a thousand of them.
        first, stem = len(self.names), frame.base + "_"
        self.names.extend([stem] * optional)
        if high is None:
            self.rules.append([[*prev, first], []])
        elif optional:
            self.rules.append([list(prev), []])
            self.rules.extend([[*prev, first + i - 1], []] for i in range(1, optional))
        if optional:
            frame.alt.append(first + optional - 1)
        frame.n_prev *= total

    def _reserve(self, rules: int, elements: int, pos: int) -> None:
        """Count what a repetition adds before building any of it."""
        if len(self.names) + rules > self.limits.rules:
            self._over("the rules a repetition adds", pos, self.limits.rules, "rules")
        if self.elements + elements > self.limits.elements:
            self._over("the copies a repetition adds", pos, self.limits.elements, "elements")
        self.elements += elements

    def _add_elements(self, count: int) -> None:
        self.elements += count
        if self.elements > self.limits.elements:
            self._over("its size", None, self.limits.elements, "elements")

    def _symbol(self, name: str) -> int:
        rule_id = self.symbols.get(name)
        if rule_id is None:
            rule_id = self.symbols[name] = self._new_rule(name)
        return rule_id

    def _generated(self, base: str) -> int:
        # llama.cpp names a synthesized rule base_N; `_` is no name character, so
        # these never meet a rule the grammar names.
        return self._new_rule(base + "_")

    def _new_rule(self, name: str) -> int:
        if len(self.names) >= self.limits.rules:
            self._over("its number of rules", None, self.limits.rules, "rules")
        self.names.append(name)
        self.rules.append(None)
        return len(self.names) - 1

    def _dead(self, body: str, pos: int) -> NoReturn:
        # When no token can go on and the grammar cannot end, llama.cpp's sampler
        # aborts the process (llama-grammar.cpp: "fatal error").
        raise InvalidRequest(
            f"{self.what}: {excerpt(body)} at {_where(self.text, pos)} requires a character "
            "no model can write (none, or only NUL)"
        )

    def _bad(self, frames: list[_Frame], pos: int) -> NoReturn:
        """The error llama.cpp reports for what cannot start or continue a sequence here."""
        char = self.text[pos]
        if char == '"':
            self._literal_error(pos + 1)
        if char == "[":
            self._literal_error(pos + 2 if self.text.startswith("[^", pos) else pos + 1, "]")
        if char in "<!":
            self._syntax("expecting '<', '[id]' or '>' in a token at", pos)
        if char == "{":
            self._syntax("expecting '}' at", pos)
        self._syntax("expecting newline or end at", pos)

    def _literal_error(self, pos: int, close: str = '"') -> NoReturn:
        while pos < len(self.text) and self.text[pos] != close:
            if self.text[pos] == "\\":
                self._escape_error(pos)
            pos += 1
        self._syntax("unexpected end of input", pos)

    def _escape_error(self, pos: int) -> None:
        escape = self.text[pos + 1 : pos + 2]
        if escape in _HEX_SIZE:
            digits = self.text[pos + 2 : pos + 2 + _HEX_SIZE[escape]]
            if len(digits) != _HEX_SIZE[escape] or not _HEX.issuperset(digits):
                self._syntax(f"expecting {_HEX_SIZE[escape]} hex chars at", pos + 2)
        elif not escape or escape not in _SIMPLE_ESCAPES:
            self._syntax("unknown escape at", pos)

    def _syntax(self, message: str, pos: int) -> NoReturn:
        detail = f"{message} {excerpt(self.text[pos:])}" if message.endswith(" at") else message
        raise InvalidRequest(f"{self.what} does not parse: {detail} ({_where(self.text, pos)})")

    def _over(self, subject: str, pos: int | None, limit: int, unit: str) -> NoReturn:
        where = f" at {_where(self.text, pos)}" if pos is not None else ""
        raise limit_exceeded(self.what, f"{subject}{where}", limit, unit)


def _matches_nothing(body: str) -> bool:
    """Whether a literal requires, or a class allows only, characters no token holds.

    Tokens never hold code point 0 (llama.cpp drops pieces that start with it and
    reads the rest as C strings), so a class allowing only 0, or a literal with a
    0 in it, matches nothing, as does a class of inverted ranges: [b-a].
    """
    if body.startswith('"'):
        return 0 in _code_points(body[1:-1])
    negated = body.startswith("[^")
    ranges = _class_ranges(_code_points(body[2:-1] if negated else body[1:-1]), body)
    if not negated:
        return not any(high >= max(low, 1) for low, high in ranges)
    covered = 1  # the first code point, from 1 up, that no range has covered yet
    for low, high in sorted(ranges):
        if low > covered:
            break
        covered = max(covered, high + 1)
    return covered > 0x10FFFF


def _code_points(text: str) -> list[int]:
    """The characters of a literal's or class's body, escapes decoded, as llama.cpp reads them."""
    points = []
    for unit in _UNITS.findall(text):
        if unit.startswith("\\") and unit[1] in _HEX_SIZE:
            points.append(int(unit[2:], 16))
        elif unit.startswith("\\"):
            points.append(ord({"t": "\t", "r": "\r", "n": "\n"}.get(unit[1], unit[1])))
        else:
            points.append(ord(unit))
    return points


def _class_ranges(points: list[int], body: str) -> list[tuple[int, int]]:
    """A class's (low, high) ranges: a - between two characters joins them, as in llama.cpp."""
    units = _UNITS.findall(body[2:-1] if body.startswith("[^") else body[1:-1])
    ranges, i = [], 0
    while i < len(points):
        if i + 2 < len(points) and units[i + 1] == "-":
            ranges.append((points[i], points[i + 2]))
            i += 3
        else:
            ranges.append((points[i], points[i]))
            i += 1
    return ranges


def _where(text: str, pos: int) -> str:
    line = text.count("\n", 0, pos) + 1
    column = pos - (text.rfind("\n", 0, pos) + 1) + 1
    return f"line {line}, column {column}"
