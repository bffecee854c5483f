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
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping

from service.cluster.replicas import Replica

_UNSEEDED = random.Random()


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
    up = [replica for replica in replicas if replica.up]
    if not up:
        return []
    least = min(replica.load for replica in up)
    draw = (ties or _UNSEEDED).random

    def key(replica: Replica) -> tuple[bool, bool, int, int, float]:
        cold = model is not None and not replica.has_loaded(model)
        near_least = replica.load - least <= balance
        prefix = matched_chars.get(replica.address, 0) if near_least else 0
        return (replica.saturated, cold, -prefix, replica.load, draw())

    return [replica.address for replica in sorted(up, key=key)]
