"""Verifying drafted tokens in the batch step (issue 47), for greedy rows on the host.

A sequence that speculates evaluates its last sampled token and the drafted
guesses after it in one chunk, with an output row for every one of them. Row i
holds the model's next token after the chunk's first i + 1 tokens, so the
model's own greedy continuation is the argmax of each row. The guesses it agrees
with, in order, are kept, and the row after the last of them gives one token
more; the cells of the guesses it rejected are dropped from the cache. At
temperature 0 the tokens are exactly those one-token steps would give.
"""

from __future__ import annotations

from collections.abc import Sequence


def verified_run(drafts: Sequence[int], model_tokens: Sequence[int]) -> list[int]:
    """The tokens a step gives: the drafts the model agreed with, then its own next.

    `model_tokens[i]` is the model's token after the chunk's first i + 1 tokens
    (one more than there are drafts)."""
    assert len(model_tokens) == len(drafts) + 1
    run = []
    for draft, token in zip(drafts, model_tokens, strict=False):
        run.append(token)
        if token != draft:
            return run
    run.append(model_tokens[len(drafts)])
    return run


def draft_room(held_cells: int, reserved_cells: int | None, wanted: int) -> int:
    """How many guesses a sequence may add: each takes a cell, which must fit what its
    slot reserved (its prompt and max_tokens), beside the token it evaluates anyway."""
    if reserved_cells is None:
        return 0
    return max(min(wanted, reserved_cells - held_cells - 1), 0)
