"""Overload control: a bound on RPCs doing model work, and on those waiting for one.

`max_active` RPCs hold a slot at once; up to `max_waiting` more wait for one,
first come first served. Past both, `slot()` raises `Overloaded` at once, so a
busy server answers RESOURCE_EXHAUSTED instead of letting clients hang.

The same two bounds hold per model too (`per_model_active`, `per_model_waiting`,
by default three quarters of the server's), so one model whose requests pile
up (a slow or stuck engine, a flood of long prompts) cannot take every slot
from the others. A request waits for its model's slot before it queues for
a server-wide one: a model at its bound holds none of the server's.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from service.errors import Overloaded, excerpt


def default_share(server_wide: int) -> int:
    """One model's share of a server-wide bound when the operator sets none: three
    quarters, rounded up (a server of one slot still serves its one model)."""
    return -(-server_wide * 3 // 4)


@dataclass
class _Slots:
    """Slots, the RPCs holding them and the RPCs waiting for one."""

    max_active: int
    max_waiting: int
    active: int = 0
    waiting: int = 0
    semaphore: asyncio.Semaphore = field(init=False)

    def __post_init__(self) -> None:
        self.semaphore = asyncio.Semaphore(self.max_active)

    @property
    def full(self) -> bool:
        return self.active + self.waiting >= self.max_active + self.max_waiting

    @asynccontextmanager
    async def held(self, *waiting_with: _Slots) -> AsyncIterator[None]:
        """A slot; until it is had, this and `waiting_with` count the RPC as waiting."""
        counted = (self, *waiting_with)
        for slots in counted:
            slots.waiting += 1
        try:
            await self.semaphore.acquire()
        finally:
            for slots in counted:
                slots.waiting -= 1
        self.active += 1
        try:
            yield
        finally:
            self.active -= 1
            self.semaphore.release()


class ConcurrencyGate:
    def __init__(
        self,
        max_active: int,
        max_waiting: int,
        per_model_active: int | None = None,
        per_model_waiting: int | None = None,
    ) -> None:
        self._server = _Slots(max_active, max_waiting)
        self.per_model_active = per_model_active or default_share(max_active)
        self.per_model_waiting = (
            default_share(max_waiting) if per_model_waiting is None else per_model_waiting
        )
        self._models: dict[str, _Slots] = {}

    @property
    def max_active(self) -> int:
        return self._server.max_active

    @property
    def max_waiting(self) -> int:
        return self._server.max_waiting

    @property
    def active(self) -> int:
        return self._server.active

    @property
    def waiting(self) -> int:
        return self._server.waiting

    @asynccontextmanager
    async def slot(self, model: str = "") -> AsyncIterator[None]:
        mine = self._models.get(model)
        if mine is None:
            mine = self._models[model] = _Slots(self.per_model_active, self.per_model_waiting)
        try:
            self._refuse_if_full(mine, model)
            # Waiting for its model's slot is waiting for the server too: max_queue
            # bounds all who wait, wherever they wait.
            async with mine.held(self._server), self._server.held():
                yield
        finally:
            if mine.active == 0 and mine.waiting == 0:  # bounded: idle models are forgotten
                self._models.pop(model, None)

    def _refuse_if_full(self, mine: _Slots, model: str) -> None:
        server = self._server
        if server.full:
            raise Overloaded(
                f"server busy: {server.active} requests running and {server.waiting} waiting "
                f"(limits {server.max_active} and {server.max_waiting}); retry later"
            )
        if mine.full:
            raise Overloaded(
                f"model {excerpt(model)} busy: {mine.active} of its requests running and "
                f"{mine.waiting} waiting (per-model limits {mine.max_active} and "
                f"{mine.max_waiting}, so other models keep their share); retry later"
            )
