"""Where a request should go: replicas ranked best first.

1. Only replicas that are up count. One that would refuse the request (at its
   --max-concurrent plus --max-waiting) goes last.
2. Replicas that have the model loaded come before those that would have to
   load it.
3. Among those, the one that was sent the longest prefix of this prompt before
   (its prompt cache probably holds it), unless it is busier than the least
   busy replica by more than `balance`: then the cache is not worth the wait.
4. Then the least loaded (running plus queued requests).
5. Ties are broken by a draw from the picker's own seeded generator.

Envoy tries the first; on a refusal before any response it retries the next.

`ranked` also says which of these steps put the first replica first (its
`Reason`), for the picker's metrics.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from service.cluster.replicas import Replica

_UNSEEDED = random.Random()

# Why the first replica is first:
#   no_replica    none is up (the picker names none: Envoy balances the request)
#   saturated     every replica that is up is at its limit (it will likely refuse)
#   only_replica  one replica is up
#   room          the next best is at its limit, the first is not (step 1)
#   model         the first has the model loaded, the next best would load it (2)
#   prefix        the first was sent a longer prefix of the prompt (3)
#   balance       another was sent a longer prefix but is more than `balance`
#                 requests busier than the least busy (3 declined), so load decided
#   least_loaded  the first is less loaded (4)
#   tie           equal in all of that: the draw decided (5)
Reason = Literal[
    "no_replica", "saturated", "only_replica", "room", "model", "prefix", "balance",
    "least_loaded", "tie",
]  # fmt: skip
REASONS: tuple[Reason, ...] = (
    "no_replica", "saturated", "only_replica", "room", "model", "prefix", "balance",
    "least_loaded", "tie",
)  # fmt: skip
# The step each field of the sort key is: the first field in which the best two differ.
_STEP_REASONS: tuple[Reason, ...] = ("room", "model", "prefix", "least_loaded", "tie")


@dataclass(frozen=True)
class Ranking:
    order: list[str]  # addresses, best first
    reason: Reason


def rank(
    replicas: Iterable[Replica],
    model: str | None,
    matched_chars: Mapping[str, int],
    *,
    balance: int = 8,
    ties: random.Random | None = None,
) -> list[str]:
    """Addresses best first. `model` None: the request names no model a replica
    could have loaded (an image request for the default image model)."""
    return ranked(replicas, model, matched_chars, balance=balance, ties=ties).order


def ranked(
    replicas: Iterable[Replica],
    model: str | None,
    matched_chars: Mapping[str, int],
    *,
    balance: int = 8,
    ties: random.Random | None = None,
) -> Ranking:
    """`rank`'s order, and why its first replica is first."""
    up = [replica for replica in replicas if replica.up]
    if not up:
        return Ranking([], "no_replica")
    least = min(replica.load for replica in up)
    draw = (ties or _UNSEEDED).random

    def key(replica: Replica) -> tuple[bool, bool, int, int, float]:
        cold = model is not None and not replica.has_loaded(model)
        near_least = replica.load - least <= balance
        prefix = matched_chars.get(replica.address, 0) if near_least else 0
        return (replica.saturated, cold, -prefix, replica.load, draw())

    keyed = sorted(((key(replica), replica) for replica in up), key=lambda pair: pair[0])
    order = [replica.address for _, replica in keyed]
    best_key, best = keyed[0]
    if best.saturated:
        return Ranking(order, "saturated")
    if len(keyed) == 1:
        return Ranking(order, "only_replica")
    next_key = keyed[1][0]
    step = next((i for i, (a, b) in enumerate(zip(best_key, next_key, strict=True)) if a != b), 4)
    reason = _STEP_REASONS[step]
    if reason in ("least_loaded", "tie"):
        # Did a replica like the first (room, model) lose its cached prefix to the balance?
        best_prefix = matched_chars.get(best.address, 0)
        if any(
            k[:2] == best_key[:2] and matched_chars.get(r.address, 0) > best_prefix
            for k, r in keyed[1:]
        ):
            reason = "balance"
    return Ranking(order, reason)
