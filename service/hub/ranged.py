"""A remote file read by byte ranges: only the blocks read are fetched, only a few kept.

A GGUF header's reader walks forward, skipping what admission does not need
(per-token scores, long strings) by seeking. Fetching every byte up to the
furthest one read, as a plain read-ahead does, would move those skipped bytes
too: a header holding a 1 GiB array took 1 GB of memory that way. Here a
read fetches the blocks it touches and nothing between them, keeps the last
KEPT_BLOCKS in memory (the reader steps back a little, never far), and
refuses to fetch more than `limit` bytes for the file.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from service.hub.budget import BudgetSpent
from service.hub.seekable import SeekableReader

BLOCK = 256 << 10
KEPT_BLOCKS = 8
# Reading on from the block before, blocks are fetched this many at a time at most.
RUN_BLOCKS = 4


class RangedFile(SeekableReader):
    """`fetch(start, end)` gives the file's bytes [start, end); `size` is the file's."""

    def __init__(
        self,
        fetch: Callable[[int, int], bytes],
        size: int,
        *,
        limit: int,
        what: str,
        block: int = BLOCK,
    ) -> None:
        super().__init__(size)
        self._fetch = fetch
        self._limit = limit
        self._what = what
        self._block = block
        self._kept: OrderedDict[int, bytes] = OrderedDict()
        self._last_fetched = -2
        self.fetched = 0  # bytes fetched so far

    def _read_at(self, position: int, into: memoryview) -> int:
        index, offset = divmod(position, self._block)
        data = self._get(index)
        count = max(0, min(len(data) - offset, len(into)))
        into[:count] = data[offset : offset + count]
        return count

    def _get(self, index: int) -> bytes:
        if index in self._kept:
            self._kept.move_to_end(index)
            return self._kept[index]
        # Reading on from the last fetch: fetch a few blocks in one request.
        run = RUN_BLOCKS if index == self._last_fetched + 1 else 1
        start = index * self._block
        end = min(start + run * self._block, self.size)
        if self.fetched + (end - start) > self._limit:
            raise BudgetSpent(
                f"reading {self._what} would fetch more than {self._limit} bytes from the "
                "hub, this server's bound for one file's metadata"
            )
        data = self._fetch(start, end)
        self.fetched += len(data)
        for offset in range(0, len(data), self._block):
            self._keep(index + offset // self._block, data[offset : offset + self._block])
        self._last_fetched = index + (len(data) - 1) // self._block
        return self._kept.get(index, b"")

    def _keep(self, index: int, data: bytes) -> None:
        self._kept[index] = data
        self._kept.move_to_end(index)
        while len(self._kept) > KEPT_BLOCKS:
            self._kept.popitem(last=False)
