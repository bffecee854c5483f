"""Pulling hub models into the cache: the flow the Pull RPC and --pull-on-demand share.

A pull resolves the reference, runs admission (so what would be refused is
refused before a weight byte moves, and a download too large for the disk is
RESOURCE_EXHAUSTED), then follows the transfer (service.hub.pull), which
concurrent callers share. A model already on disk needs no transfer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from service.admission import Capability, Decision
from service.errors import InvalidRequest, NotSupported, Overloaded
from service.hub.pull import Puller, PullState
from service.model_source import HubReference, ModelSource
from service.models.catalog import ModelSpec
from service.models.pool import ModelPool


@dataclass(frozen=True)
class PullStep:
    decision: Decision  # admission's answer, with the download
    state: PullState


@dataclass(frozen=True)
class Pulled:
    """What pulling before a Generate cost it."""

    milliseconds: float
    transferred: int


class Pulls:
    def __init__(
        self, pool: ModelPool, puller: Puller | None, refusal: str, *, on_demand: bool = False
    ) -> None:
        self._pool = pool
        self._puller = puller
        self._refusal = refusal  # why there is no puller
        self._on_demand = on_demand and puller is not None

    async def transfer(self, model: str, capability: Capability) -> AsyncIterator[PullStep]:
        """The steps of pulling `model`; none when it is on disk already."""
        if self._puller is None:
            raise NotSupported(self._refusal)
        spec, source = await self._resolve(model)
        if source.hub is None:
            raise InvalidRequest(f"{model!r} is not a Hugging Face hub model: nothing to pull")
        if not source.available_locally:
            async for step in self._fetch(model, spec, source.hub, capability):
                yield step

    async def before_generate(self, model: str) -> Pulled | None:
        """With --pull-on-demand, pull a hub model that is not on disk; None if nothing
        was pulled (pulling on demand is off, or the model needs none)."""
        if not self._on_demand:
            return None
        spec, source = await self._resolve(model)
        if source.hub is None or source.available_locally:
            return None
        began = time.monotonic()
        transferred = 0
        async for step in self._fetch(model, spec, source.hub, Capability.TEXT):
            transferred = step.state.transferred
        return Pulled((time.monotonic() - began) * 1000, transferred)

    async def _resolve(self, model: str) -> tuple[ModelSpec, ModelSource]:
        spec = await asyncio.to_thread(self._pool.catalog.resolve, model)
        return spec, await asyncio.to_thread(spec.locate)

    async def _fetch(
        self, model: str, spec: ModelSpec, hub: HubReference, capability: Capability
    ) -> AsyncIterator[PullStep]:
        """Admission, the disk check, then the (shared) transfer."""
        assert self._puller is not None
        decision = await self._pool.admission(spec, capability)
        download = decision.download
        if not decision.admitted or download is None:
            raise NotSupported(f"{model!r} is not pulled: {decision.reason}")
        if not download.fits_on_disk:
            raise Overloaded(
                f"{model!r} takes {download.total_bytes} bytes; the disk holding the hub "
                f"cache has {download.free_bytes} free"
            )
        async for state in self._puller.pull(hub, download):
            yield PullStep(decision, state)
