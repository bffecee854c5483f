"""What one batch step evaluates: the plan as a value, decided without a model.

Every sequence in the batch is either decoding (one new token a step) or still
reading its prompt. A step's batch holds `capacity` tokens. The plan:

1. every decoding sequence gets its one token, first: streams never wait;
2. prompts fill what room is left, in arrival order, so the oldest prompt is
   never starved by newer ones; a prompt longer than the room is split into
   chunks over several steps;
3. while any sequence decodes, prompts get at most `prefill_chunk` tokens a
   step, so one long prompt adds a bounded time to every stream's next token;
   with nothing decoding they get the whole batch (nobody waits on them).

A sequence whose token is still being drawn beside the step (a grammar's, see
`service.backends.llama_cpp.own_draws`) sits the step out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Seat:
    """One sequence as the planner sees it."""

    pending: int  # tokens left to evaluate: the rest of the prompt, or the last sample
    decoding: bool  # past its prompt
    drawing: bool = False  # its next token is still being drawn: it sits out


def plan_step(seats: Sequence[Seat], capacity: int, prefill_chunk: int) -> list[int]:
    """Tokens each seat evaluates this step, in the order given (0: none)."""
    decoding = sum(1 for seat in seats if seat.decoding and not seat.drawing)
    room = capacity - decoding
    if decoding:
        room = min(room, prefill_chunk)
    takes = []
    for seat in seats:
        if seat.drawing:
            takes.append(0)
        elif seat.decoding:
            takes.append(min(1, seat.pending))
        else:
            take = min(seat.pending, max(room, 0))
            room -= take
            takes.append(take)
    return takes
