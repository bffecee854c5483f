"""Pulling hub models into the cache: the flow the Pull RPC and --pull-on-demand share.

A pull resolves the reference, runs admission (so what would be refused is
refused before a weight byte moves, and a download too large for the disk is
RESOURCE_EXHAUSTED), then follows the transfer (service.hub.pull), which
concurrent callers share. A model already on disk needs no transfer.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass
from pathlib import Path

from service.admission import Capability, Decision
from service.errors import InvalidRequest, NotSupported, excerpt
from service.hub.disk import cache_failure, unwritable_cache
from service.hub.inventory import CachedModel, cached_models, delete_cached, snapshot_folder
from service.hub.pull import Puller, PullState
from service.model_source import HubReference, ModelSource
from service.models.catalog import ModelSpec
from service.models.pool import ModelPool
from service.models.sources import hub_reference


@dataclass(frozen=True)
class PullStep:
    decision: Decision  # admission's answer, with the download
    state: PullState


class Pulls:
    def __init__(
        self,
        pool: ModelPool,
        puller: Puller | None,
        refusal: str,
        *,
        on_demand: bool = False,
        cache_dir: Path | None = None,
        may_delete: bool = False,
    ) -> None:
        self._pool = pool
        self._puller = puller
        self._refusal = refusal  # why there is no puller
        self._on_demand = on_demand and puller is not None
        self.cache_dir = cache_dir
        self._may_delete = may_delete and cache_dir is not None

    async def transfer(self, model: str, capability: Capability) -> AsyncGenerator[PullStep, None]:
        """The steps of pulling `model`. A cached copy is checked against the hub's
        hashes, and what fails is fetched again; a sound one moves no byte."""
        if self._puller is None:
            raise NotSupported(self._refusal)
        spec, source = await self._resolve(model)
        if source.hub is None:
            raise InvalidRequest(f"{model!r} is not a Hugging Face hub model: nothing to pull")
        async with aclosing(self._fetch(model, spec, source.hub, capability)) as steps:
            async for step in steps:
                yield step

    async def before_generate(self, model: str) -> AsyncGenerator[PullState, None]:
        """With --pull-on-demand, pull a hub model that is not on disk, and say how it
        goes; nothing when pulling on demand is off or the model needs no pull."""
        if not self._on_demand:
            return
        spec, source = await self._resolve(model)
        if source.hub is None or source.available_locally:
            return
        async with aclosing(self._fetch(model, spec, source.hub, Capability.TEXT)) as steps:
            async for step in steps:
                yield step.state

    async def cached(self) -> list[CachedModel]:
        """What the hub cache holds."""
        if self.cache_dir is None:
            return []
        return await asyncio.to_thread(cached_models, self.cache_dir)

    async def delete(self, model: str) -> tuple[list[str], int]:
        """Remove a repo, one revision of it, or one file of a revision from the hub cache."""
        if not self._may_delete or self.cache_dir is None:
            raise NotSupported(
                "this server does not let clients change its hub cache: start it with "
                "--allow-pull to allow pulls and deletions"
            )
        hub = hub_reference(model)
        if hub is None:
            raise InvalidRequest(
                f"{excerpt(model)} is not a hub model: name owner/name or owner/name@REVISION"
            )
        if self._puller is not None and self._puller.busy(hub.repo_id):
            raise NotSupported(
                f"{excerpt(hub.repo_id)} is being pulled: delete it once the pull has ended"
            )
        # A loaded model's engine keeps its files mapped: deleting them would free
        # nothing while it runs, and leave it serving from a deleted file.
        folder = await asyncio.to_thread(snapshot_folder, self.cache_dir, hub)
        if folder is not None:
            await self._pool.release_files(folder, f"deleting {excerpt(str(hub))}")
        try:
            return await asyncio.to_thread(delete_cached, self.cache_dir, hub)
        except OSError as exc:
            failure = cache_failure(exc, self.cache_dir, f"deleting {excerpt(str(hub))}")
            if failure is None:
                raise
            raise failure from exc

    async def _resolve(self, model: str) -> tuple[ModelSpec, ModelSource]:
        spec = await asyncio.to_thread(self._pool.catalog.resolve, model)
        return spec, await asyncio.to_thread(spec.locate)

    async def _fetch(
        self, model: str, spec: ModelSpec, hub: HubReference, capability: Capability
    ) -> AsyncGenerator[PullStep, None]:
        """Admission, the disk check, then the (shared) transfer."""
        assert self._puller is not None
        if self.cache_dir is not None:  # before the hub is asked anything
            unwritable = await asyncio.to_thread(
                unwritable_cache, self.cache_dir, f"pulling {excerpt(str(hub))}"
            )
            if unwritable is not None:
                raise unwritable
        decision = await self._pool.admission(spec, capability, from_hub=True)
        download = decision.download
        if not decision.admitted or download is None:
            raise NotSupported(f"{model!r} is not pulled: {decision.reason}")
        async with aclosing(self._puller.pull(hub, download)) as states:
            async for state in states:
                yield PullStep(decision, state)
