"""The models loaded now, each with the worker thread that owns it.

A model is loaded on first use, once even when several requests ask for it
at the same moment.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from service.backends.base import TextBackend
from service.models.catalog import Catalog, ModelSpec
from service.models.worker import ModelWorker

BackendLoader = Callable[[ModelSpec], TextBackend]


@dataclass
class LoadedModel:
    spec: ModelSpec
    backend: TextBackend
    worker: ModelWorker
    loaded_at: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.time)
    active_requests: int = 0

    @property
    def name(self) -> str:
        return self.spec.name


class ModelPool:
    def __init__(self, catalog: Catalog, loader: BackendLoader) -> None:
        self.catalog = catalog
        self._loader = loader
        self._loaded: dict[str, LoadedModel] = {}
        self._load_locks: dict[str, asyncio.Lock] = {}

    def loaded(self) -> list[LoadedModel]:
        return list(self._loaded.values())

    @asynccontextmanager
    async def use(self, name: str) -> AsyncIterator[LoadedModel]:
        """The loaded model for `name` (loading it if needed), held for one request."""
        model = await self.get(name)
        model.active_requests += 1
        try:
            yield model
        finally:
            model.active_requests -= 1
            model.last_used = time.time()

    async def get(self, name: str) -> LoadedModel:
        spec = self.catalog.resolve(name)
        if (model := self._loaded.get(spec.name)) is not None:
            return model
        lock = self._load_locks.setdefault(spec.name, asyncio.Lock())
        async with lock:
            if (model := self._loaded.get(spec.name)) is not None:
                return model
            model = await self._load(spec)
            self._loaded[spec.name] = model
            return model

    async def _load(self, spec: ModelSpec) -> LoadedModel:
        worker = ModelWorker(spec.name)
        try:
            backend = await worker.call(lambda: self._loader(spec))
        except BaseException:
            worker.shutdown()
            raise
        return LoadedModel(spec=spec, backend=backend, worker=worker)

    async def close(self) -> None:
        models, self._loaded = list(self._loaded.values()), {}
        for model in models:
            await model.worker.call(model.backend.close)
            model.worker.shutdown()
