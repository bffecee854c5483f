"""Which replica was last sent each prompt block: an approximate map of the
replicas' prompt caches, learned from the picker's own routing.

A replica's cache keeps the prompts it evaluated recently, so a block routed
there recently is probably still cached there. The table holds at most
`capacity` blocks and forgets the least recently routed first; a replica that
went away (its cache with it) is forgotten at once.
"""

from __future__ import annotations

from collections import OrderedDict

from service.cluster.prompt_blocks import Block


class PrefixTable:
    def __init__(self, capacity: int = 200_000) -> None:
        self.capacity = capacity
        # block digest -> replicas it was routed to, most recent last
        self._owners: OrderedDict[bytes, list[str]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._owners)

    def record(self, replica: str, blocks: list[Block]) -> None:
        for block in blocks:
            owners = self._owners.pop(block.digest, [])
            if replica in owners:
                owners.remove(replica)
            owners.append(replica)
            self._owners[block.digest] = owners
        while len(self._owners) > self.capacity:
            self._owners.popitem(last=False)

    def matched_chars(self, blocks: list[Block]) -> dict[str, int]:
        """For each replica, how many leading characters of this prompt it was
        sent before (the end of the longest run of blocks it holds from the start)."""
        matched: dict[str, int] = {}
        still_matching: set[str] | None = None
        for block in blocks:
            owners = set(self._owners.get(block.digest, ()))
            still_matching = owners if still_matching is None else still_matching & owners
            if not still_matching:
                break
            for replica in still_matching:
                matched[replica] = block.end
        return matched

    def forget(self, replica: str) -> None:
        for digest in [d for d, owners in self._owners.items() if replica in owners]:
            owners = self._owners[digest]
            owners.remove(replica)
            if not owners:
                del self._owners[digest]
