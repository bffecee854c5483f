"""Turning a stream of token bytes into text deltas that are safe to send.

Two things hold text back before it may leave the server:
- an incomplete UTF-8 character (a token may end in the middle of one);
- a tail that could still grow into a stop sequence (stop sequences are
  matched across token boundaries and never sent).

Text leaves together with the ids of exactly the tokens that wrote it, so a
client that joins the bytes of a delta's tokens gets the delta's text. To keep
that true, tokens are grouped into units: consecutive tokens whose bytes end on
a character boundary (usually one token; several when a character is split
across tokens). Only whole units are released, except at a matched stop: see
`TextAssembler`.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass, field

# A unit ends after this many tokens even inside a character. One character
# split byte by byte takes at most 4 tokens; a longer run means tokens that
# each hold the end of one character and the start of the next (byte-level BPE
# can make those), and waiting for the run to end could hold text back for the
# rest of the generation. Past it, a delta's tokens may end inside a character
# whose last bytes come with the next delta's tokens.
MAX_UNIT_TOKENS = 8


@dataclass(frozen=True)
class Released:
    """Text that may be sent now, the tokens that wrote it, and a matched stop."""

    text: str
    token_ids: tuple[int, ...]
    stop_sequence: str | None = None


def _held_suffix_length(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest tail of `text` that is a proper prefix of a stop."""
    longest = 0
    for stop in stops:
        for length in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:length]):
                longest = length
                break
    return longest


def releasable_length(text: str, stops: tuple[str, ...]) -> int:
    """How much of `text` (with no stop in it) can no longer become part of a stop."""
    return len(text) - _held_suffix_length(text, stops)


def earliest_stop(text: str, stops: tuple[str, ...]) -> tuple[int, str] | None:
    """Where the first stop in `text` begins, and which one."""
    found = [(text.find(stop), stop) for stop in stops]
    hits = [(position, stop) for position, stop in found if position >= 0]
    return min(hits) if hits else None


@dataclass
class _Unit:
    """Consecutive tokens whose bytes together end on a character boundary
    (or MAX_UNIT_TOKENS tokens that do not)."""

    ids: list[int]
    text: str


@dataclass
class TextAssembler:
    """Decodes token bytes incrementally and applies the stop sequences.

    Without a stop, text goes out a whole unit at a time, as soon as no stop
    can begin inside it; a unit that only partly could waits for later tokens.
    When a stop matches, the text before it goes out: units wholly before the
    stop with their ids, the tokens of the stop (and anything after it) are
    dropped. A token that straddles the start of the stop (stop "\\n\\n",
    token ".\\n\\n") is the one exception: its text before the stop is sent
    without its id, since its id would stand for the stop's text too.
    `flush` releases everything still held, with all its ids.
    """

    stops: tuple[str, ...] = ()
    _decoder: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")(errors="replace")
    )
    # Held units, oldest first; the last is open while it ends inside a character.
    _units: list[_Unit] = field(default_factory=list)
    _open: bool = False

    def __post_init__(self) -> None:
        # An empty stop would match before any text; requests cannot send one.
        self.stops = tuple(stop for stop in self.stops if stop)

    def push(self, token_id: int, piece: bytes) -> Released:
        """Add one token; return what may be sent now."""
        text = self._decoder.decode(piece)
        if self._open:
            unit = self._units[-1]
            unit.ids.append(token_id)
            unit.text += text
        else:
            unit = _Unit([token_id], text)
            self._units.append(unit)
        inside_character = self._decoder.getstate()[0] != b""
        self._open = inside_character and len(unit.ids) < MAX_UNIT_TOKENS
        return self._release(final=False)

    def flush(self) -> Released:
        """Release everything held back; called when generation ends without a stop."""
        tail = self._decoder.decode(b"", final=True)  # a cut-off character: U+FFFD
        if self._open:
            self._units[-1].text += tail
        elif tail:  # a run cut at MAX_UNIT_TOKENS ended inside a character
            self._units.append(_Unit([], tail))  # its tokens went out already
        self._open = False
        return self._release(final=True)

    def _release(self, final: bool) -> Released:
        units = self._units
        # Usually one unit is held: skip the join, and the scans when there are no stops.
        text = units[0].text if len(units) == 1 else "".join(unit.text for unit in units)
        if not self.stops:
            return self._take_units(len(text))
        match = earliest_stop(text, self.stops)
        if match is not None:
            return self._cut_at_stop(text, *match)
        return self._take_units(len(text) if final else releasable_length(text, self.stops))

    def _take_units(self, limit: int) -> Released:
        """Release the leading closed units whose text ends within `limit` characters."""
        closed = len(self._units) - (1 if self._open else 0)
        count, length = 0, 0
        for unit in self._units[:closed]:
            length += len(unit.text)
            if length > limit:
                break
            count += 1
        taken = self._units[:count]
        del self._units[:count]
        if len(taken) == 1:
            return Released(taken[0].text, tuple(taken[0].ids))
        return Released("".join(u.text for u in taken), tuple(i for u in taken for i in u.ids))

    def _cut_at_stop(self, text: str, position: int, stop: str) -> Released:
        ids: list[int] = []
        length = 0
        for unit in self._units:
            if length + len(unit.text) > position:
                break  # this unit holds (part of) the stop; it and the rest are not sent
            ids.extend(unit.ids)
            length += len(unit.text)
        self._units, self._open = [], False
        return Released(text[:position], tuple(ids), stop)
