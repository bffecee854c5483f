"""Turning a stream of token bytes into text deltas that are safe to send.

Two things hold text back before it may leave the server:
- an incomplete UTF-8 character (a token may end in the middle of one);
- a tail that could still grow into a stop sequence (stop sequences are
  matched across token boundaries and never sent).
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Released:
    """Text that may be sent now, the tokens it completes, and a matched stop."""

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


@dataclass
class StopMatcher:
    """Finds stop sequences in text that arrives in pieces."""

    stops: tuple[str, ...]
    _pending: str = ""

    def push(self, text: str) -> tuple[str, str | None]:
        """Add text; return what is safe to release and the stop that matched."""
        self._pending += text
        match = self._earliest_match()
        if match is not None:
            position, stop = match
            released = self._pending[:position]
            self._pending = ""
            return released, stop
        held = _held_suffix_length(self._pending, self.stops)
        cut = len(self._pending) - held
        released, self._pending = self._pending[:cut], self._pending[cut:]
        return released, None

    def flush(self) -> str:
        released, self._pending = self._pending, ""
        return released

    def _earliest_match(self) -> tuple[int, str] | None:
        found = [(self._pending.find(stop), stop) for stop in self.stops]
        hits = [(position, stop) for position, stop in found if position >= 0]
        return min(hits) if hits else None


@dataclass
class TextAssembler:
    """Decodes token bytes incrementally and applies the stop sequences."""

    stops: tuple[str, ...] = ()
    _decoder: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")(errors="replace")
    )
    _matcher: StopMatcher = field(init=False)
    _pending_ids: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._matcher = StopMatcher(self.stops)

    def push(self, token_id: int, piece: bytes) -> Released:
        self._pending_ids.append(token_id)
        text, stop = self._matcher.push(self._decoder.decode(piece))
        return self._release(text, stop)

    def flush(self) -> Released:
        """Release everything held back; called when generation ends without a stop."""
        tail = self._decoder.decode(b"", final=True)
        text, stop = self._matcher.push(tail)
        return self._release(text + ("" if stop else self._matcher.flush()), stop)

    def _release(self, text: str, stop: str | None) -> Released:
        if not text and stop is None:
            return Released("", ())
        # Tokens that only make up a stop sequence are dropped with it.
        ids = tuple(self._pending_ids) if text else ()
        self._pending_ids.clear()
        return Released(text, ids, stop)
