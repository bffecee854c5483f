"""Which cached sequence a new request reuses, and what must be evicted for it.

A llama.cpp context with a unified KV cache holds several sequences, each
under a sequence id ("slot"). A slot keeps the tokens it evaluated after its
request finishes, so the next request whose prompt extends them evaluates
only the new suffix (a multi-turn chat resends the whole conversation).

The table is pure bookkeeping; the backend carries out its placements on the
real cache. Finished sequences beyond the most recent one are parked: their
cells are copied to host memory and freed, and copied back when a prompt
extends them.

Room is counted conservatively: every live slot's tokens, plus the tokens each
running sequence may still add (its prompt and max_tokens), must fit the
cache. Tokens shared between slots are counted once per slot, so the table may
make a request wait that would have fitted, never the reverse.

With a per-sequence cache (`shared=False`) each slot has cells of its own,
`capacity` of them, and nothing is parked: a cached conversation costs other
sequences no attention. llama.cpp then splits a batch into one forward pass
per run of consecutive sequence ids, so running sequences take the lowest
free ids and finished conversations move to the highest.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from service.backends.base import common_prefix_length

_clock = itertools.count()


@dataclass(eq=False)
class Slot:
    seq_id: int
    # The tokens the cache holds for this sequence id, position 0 on.
    tokens: list[int] = field(default_factory=list)
    # While a request runs here: the most tokens it may hold when done.
    reserved: int | None = None
    last_used: int = 0
    # An idle slot whose cells were copied out to host memory and freed.
    parked: bool = False

    @property
    def busy(self) -> bool:
        return self.reserved is not None

    @property
    def charged(self) -> int:
        """Cache cells this slot is counted for."""
        return max(self.reserved or 0, 0 if self.parked else len(self.tokens))


@dataclass(frozen=True)
class Placement:
    """How to set up the cache for a new sequence, in this order."""

    slot: Slot
    # Idle slots to empty first, to make room.
    evict: tuple[Slot, ...]
    # Tokens the slot keeps from its own cache; the rest of it is removed.
    keep: int
    # Or: copy the first `reuse` tokens from this other slot (shared, not duplicated).
    copy_from: Slot | None
    # Prompt tokens already in the cache once the placement is done.
    reuse: int
    # Forget `copy_from` once copied: its conversation moved to `slot`.
    moves: bool = False


@dataclass(frozen=True)
class Retention:
    """What to do with finished sequences when one more finishes."""

    park: tuple[Slot, ...]  # copy their cells to host memory and free them
    drop: tuple[Slot, ...]  # forget them
    # (from, to): move a conversation's cells to an empty slot (per-sequence caches).
    move: tuple[tuple[Slot, Slot], ...] = ()


class SlotTable:
    def __init__(
        self,
        slots: int,
        capacity: int,
        keep_idle: int | None = None,
        keep_live: int = 1,
        shared: bool = True,
    ) -> None:
        self.slots = [Slot(seq_id) for seq_id in range(slots)]
        # Cells of the whole cache when shared, else of each slot.
        self.capacity = capacity
        self.shared = shared
        # Finished sequences kept cached; None: as many as there are slots.
        self.keep_idle = slots if keep_idle is None else keep_idle
        # Of those, the most recent ones left in the cache itself; the rest are parked.
        self.keep_live = keep_live

    def place(self, prompt: Sequence[int], max_tokens: int) -> Placement | None:
        """Where a new sequence goes, or None when the cache has no room now.

        A prompt that extends everything an idle slot holds continues in that
        slot. A prompt sharing only part of a slot (a common system prompt, a
        branch of a conversation) gets the shared prefix copied into another
        slot (in a unified cache the copy shares cells), so the conversation
        cached there survives for its own next turn. The last prompt token is
        never reused, so that the logits the first sample reads are this prompt's.
        With a per-sequence cache, a continued conversation moves down to the
        lowest empty slot, next to the other running sequences.
        """
        donor, common = self._longest_prefix(prompt[:-1])
        if donor is not None and not donor.busy and common == len(donor.tokens):
            lower = self._empty_slot_below(donor)
            if lower is None:
                return self._placement(donor, common, None, need=prompt, more=max_tokens)
            placement = self._placement(lower, 0, donor, need=prompt, more=max_tokens)
            return placement and replace(placement, moves=True)
        for slot, keep, copy_from in self._branch_choices(donor, common):
            placement = self._placement(slot, keep, copy_from, need=prompt, more=max_tokens)
            if placement is not None:
                return placement
        return None

    def _branch_choices(
        self, donor: Slot | None, common: int
    ) -> list[tuple[Slot, int, Slot | None]]:
        """Where a prompt that shares `common` tokens with `donor` (but does not extend
        it) may go, best first, as (slot, tokens kept, slot copied from).

        Best is a free slot with the shared prefix copied in, which keeps the donor's
        conversation for its own next turn. When that leaves no room (the donor is
        counted whole: a long answer after the same prompt), the cached conversation
        yields to the request: the prompt branches inside the donor, reusing the
        prefix and giving up the rest. A request that fits the cache is never
        refused room because its own prefix is cached."""
        target = self._free_slot(exclude=donor)
        worth = donor is not None and self._worth_copying(donor, common)
        choices: list[tuple[Slot, int, Slot | None]] = []
        if target is not None:
            choices.append((target, 0, donor if worth else None))
        if donor is not None and not donor.busy:
            choices.append((donor, common, None))
        if target is not None and worth:
            choices.append((target, 0, None))  # the donor may be evicted like any other
        return choices

    def _empty_slot_below(self, slot: Slot) -> Slot | None:
        """With a per-sequence cache, the lowest empty slot below `slot`, to move a
        continued conversation down among the running ones."""
        if self.shared:
            return None
        empty = [s for s in self.slots if not s.busy and not s.tokens and s.seq_id < slot.seq_id]
        return min(empty, key=lambda s: s.seq_id) if empty else None

    def _worth_copying(self, donor: Slot, common: int) -> bool:
        """Restoring a parked sequence copies all of its cells back, and a copy between
        per-sequence caches copies the donor's whole cache, so a copy pays only when
        the shared prefix is a fair share of the donor: a prompt that shares just its
        first few tokens (a BOS, a common first word) computes them instead."""
        if not common:
            return False
        whole = donor.parked or not self.shared
        return not whole or common * _WHOLE_COPY_SHARE >= len(donor.tokens)

    def occupy(self, placement: Placement, prompt_length: int, max_tokens: int) -> None:
        """Record a placement as carried out."""
        for slot in placement.evict:
            slot.tokens.clear()
        slot = placement.slot
        slot.parked = False
        source = placement.copy_from.tokens if placement.copy_from else slot.tokens
        slot.tokens = list(source[: placement.reuse])
        slot.reserved = prompt_length + max_tokens
        slot.last_used = next(_clock)

    def moved(self, source: Slot, target: Slot) -> None:
        """Record a move of `Retention.move` as carried out."""
        target.tokens, source.tokens = source.tokens, []
        target.last_used = source.last_used

    def release(self, slot: Slot) -> Retention:
        """Mark a slot idle; which finished sequences to park and which to drop now.

        Every cell in llama.cpp's unified cache costs attention time in every
        step (it attends over all used cells, masked), so only the `keep_live`
        most recent finished sequences stay in it; up to `keep_idle` in all are
        kept, the older ones parked in host memory (no more tokens than the cache
        holds, so at most one more cache's worth of memory), and the rest forgotten.
        """
        slot.reserved = None
        slot.last_used = next(_clock)
        cached = sorted(
            (s for s in self.slots if not s.busy and s.tokens),
            key=lambda s: s.last_used,
            reverse=True,
        )
        kept, drop = cached[: self.keep_idle], cached[self.keep_idle :]
        if not self.shared:
            return Retention(park=(), drop=tuple(drop), move=self._move_up(slot, kept, drop))
        park: list[Slot] = []
        parked_tokens = 0
        for older in kept[self.keep_live :]:  # most recent first
            parked_tokens += len(older.tokens)
            # Parked cells take host memory: at most one cache's worth.
            if parked_tokens > self.capacity:
                drop.append(older)
            elif not older.parked:
                park.append(older)
        return Retention(park=tuple(park), drop=tuple(drop))

    def _move_up(
        self, slot: Slot, kept: list[Slot], drop: list[Slot]
    ) -> tuple[tuple[Slot, Slot], ...]:
        """Where a kept conversation goes so that it leaves the low ids to running ones:
        the highest empty slot above it (or one being emptied), if any."""
        if slot not in kept:
            return ()
        empty = [s for s in self.slots if not s.busy and (not s.tokens or s in drop)]
        above = [s for s in empty if s.seq_id > slot.seq_id]
        return ((slot, max(above, key=lambda s: s.seq_id)),) if above else ()

    def _longest_prefix(self, prompt: Sequence[int]) -> tuple[Slot | None, int]:
        best: Slot | None = None
        best_length = 0
        for slot in self.slots:
            length = common_prefix_length(slot.tokens, prompt)
            if length > best_length or (length == best_length > 0 and _preferred(slot, best)):
                best, best_length = slot, length
        return best, best_length

    def _placement(
        self, slot: Slot, keep: int, copy_from: Slot | None, need: Sequence[int], more: int
    ) -> Placement | None:
        reuse = keep if copy_from is None else common_prefix_length(copy_from.tokens, need[:-1])
        evict = self._evictions(slot, len(need) + more, spare=copy_from)
        if evict is None:
            return None
        return Placement(slot, evict, keep, copy_from, reuse)

    def _free_slot(self, exclude: Slot | None) -> Slot | None:
        """An idle slot to start afresh in: the empty one with the lowest id, else the
        least recently used."""
        idle = [slot for slot in self.slots if not slot.busy and slot is not exclude]
        if not idle:
            return None
        return min(idle, key=lambda s: (bool(s.tokens), s.last_used if s.tokens else s.seq_id))

    def _evictions(self, target: Slot, need: int, spare: Slot | None) -> tuple[Slot, ...] | None:
        """Idle slots to empty, least recently used first, so that `need` more fits.

        `spare` (the slot a prefix is copied from) is not evicted.
        """
        if not self.shared:  # the target's own cells are all it needs
            return () if need <= self.capacity else None
        others = [slot for slot in self.slots if slot is not target]
        used = sum(slot.charged for slot in others) + need
        evict: list[Slot] = []
        candidates = sorted(
            (
                slot
                for slot in others
                if not slot.busy and slot.tokens and not slot.parked and slot is not spare
            ),
            key=lambda slot: slot.last_used,
        )
        for slot in candidates:
            if used <= self.capacity:
                break
            used -= len(slot.tokens)
            evict.append(slot)
        return tuple(evict) if used <= self.capacity else None


# See SlotTable._worth_copying.
_WHOLE_COPY_SHARE = 8


def _preferred(slot: Slot, best: Slot | None) -> bool:
    """On a tie, whether `slot` is the better donor than `best`: an idle slot can be
    reused in place, and a live one shares its cells where a parked one is copied."""
    if best is None:
        return True
    return (best.busy and not slot.busy) or (best.parked and not slot.parked and not slot.busy)
