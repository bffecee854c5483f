"""What judging a hub model may cost before any pull: bytes read, time, reads at once.

Admit needs no --allow-pull, so anyone who may call it can point the server at
any repo on the hub (or at a hostile mirror). Whatever that repo holds, one
Admit reads at most:

- LISTING_BYTES of file listing (the JSON the hub API gives for the repo:
  about 220 bytes a file, so some 38,000 files; past it the repo is refused);
- HEADER_BYTES for one GGUF header (Gemma 3's 262k-token vocabulary takes
  about 6 MB, Llama 3's tokens and merges about 7 MB; strings the admission
  does not need are skipped by seeking, never fetched);
- ADMIT_BYTES in all (the listing, every part's header, configs);

and at most CONCURRENT_READS Admits read hub metadata at once. In memory, a
read holds the parsed listing, a few blocks of the file being read and the
vocabulary's hashes (8 bytes a token): docs/hub.md, "What an Admit may cost", states the bound.
"""

from __future__ import annotations

import threading
import time

from service.errors import Unavailable

LISTING_BYTES = 8 << 20
HEADER_BYTES = 32 << 20
ADMIT_BYTES = 64 << 20
CONCURRENT_READS = 2
# JSON objects and arrays a listing or a config may hold: a parsed container costs
# some 60-400 bytes, so 8 MiB of `{}` would cost about a gigabyte to parse. A real
# listing has two per file (the file, its LFS pointer): 38,000 files need 76,000.
LISTING_CONTAINERS = 1 << 17
# Items (array elements, object members) a listing may hold: seven a file as the hub
# writes them (266,000 for 38,000 files); 8 MiB of two-letter strings are 1.6 million,
# some 100 MB parsed.
LISTING_ITEMS = 1 << 19
CONFIG_CONTAINERS = 1 << 16


def json_containers(raw: bytes) -> int:
    """An upper bound on the JSON objects and arrays in `raw`, counted at C speed
    without parsing (brackets inside strings count too)."""
    return raw.count(b"{") + raw.count(b"[")


def json_items(raw: bytes) -> int:
    """An upper bound on the items in `raw`'s arrays and objects: every one but a
    container's first follows a comma (commas inside strings count too)."""
    return raw.count(b",") + json_containers(raw)


class BudgetSpent(Exception):
    """More bytes were wanted than the read may take; the message says what and how many."""


class ReadBudget:
    """The bytes and the time one admission's hub reads may still take."""

    def __init__(self, total: int = ADMIT_BYTES, seconds: float = 30.0) -> None:
        self.total = total
        self.spent = 0
        self.deadline = time.monotonic() + seconds

    def spend(self, count: int, what: str) -> None:
        """Account for `count` bytes about to be read; BudgetSpent past the total."""
        if self.spent + count > self.total:
            raise BudgetSpent(
                f"{what} would take the bytes read from the hub for this admission past "
                f"{self.total} ({self.spent} read so far); real models' metadata takes a "
                "few MB"
            )
        self.check_time()
        self.spent += count

    def check_time(self) -> None:
        if time.monotonic() > self.deadline:
            raise Unavailable("the hub's metadata took too long to arrive; retry later")

    def left(self) -> float:
        return max(0.0, self.deadline - time.monotonic())


class ReadSlots:
    """At most `count` admissions read hub metadata at once; others wait their deadline."""

    def __init__(self, count: int = CONCURRENT_READS) -> None:
        self._slots = threading.BoundedSemaphore(count)
        self.count = count

    def acquire(self, budget: ReadBudget) -> None:
        if not self._slots.acquire(timeout=budget.left()):
            raise Unavailable(
                f"{self.count} admissions are reading hub metadata and this one waited its "
                "deadline for them; retry later"
            )

    def release(self) -> None:
        self._slots.release()
