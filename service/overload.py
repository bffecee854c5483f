"""Overload control: a bound on RPCs doing model work, and on those waiting for one.

`max_active` RPCs hold a slot at once; up to `max_waiting` more wait for one,
first come first served. Past both, `slot()` raises `Overloaded` at once, so a
busy server answers RESOURCE_EXHAUSTED instead of letting clients hang.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from service.errors import Overloaded


class ConcurrencyGate:
    def __init__(self, max_active: int, max_waiting: int) -> None:
        self.max_active = max_active
        self.max_waiting = max_waiting
        self.active = 0
        self.waiting = 0
        self._slots = asyncio.Semaphore(max_active)

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        if self.active + self.waiting >= self.max_active + self.max_waiting:
            raise Overloaded(
                f"server busy: {self.active} requests running and {self.waiting} waiting "
                f"(limits {self.max_active} and {self.max_waiting}); retry later"
            )
        self.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.waiting -= 1
        self.active += 1
        try:
            yield
        finally:
            self.active -= 1
            self._slots.release()
