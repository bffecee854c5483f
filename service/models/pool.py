"""The models loaded now: an LRU under a memory budget, each model on its own worker thread.

- A model is admitted (see `service.admission`) before it is loaded, and its
  memory estimated from metadata: host memory, budgeted against `budget_bytes`,
  and the GPU memory of the layers llama.cpp offloads, budgeted against
  `device_budget_bytes` when one is set.
- Loading evicts least-recently-used idle models until the new one fits. A
  model with a request in progress is never evicted; a load waits up to
  `load_wait` seconds for one to go idle, then fails with RESOURCE_EXHAUSTED.
- Loads happen one at a time, so concurrent requests for a model that is not
  loaded trigger one load, and the budget arithmetic never races.
- A model whose backend failed mid-request is discarded: new requests load a
  fresh copy, and the broken one is closed once its last user leaves.
- Idle models are unloaded after `keep_alive` seconds, except the default.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import cast

import structlog

from service.admission import Capability, Decision
from service.admission.gates import LLAMA_CPP
from service.backends.base import TextBackend
from service.decode.scheduler import DecodeScheduler
from service.errors import (
    BackendFailure,
    NotSupported,
    Overloaded,
    ServiceError,
    Unavailable,
)
from service.images.backend import ImageBackend
from service.models.catalog import Catalog, ModelSpec
from service.models.memory import MemoryNeed, format_bytes
from service.models.sources import ModelSource
from service.models.worker import ModelWorker

log = structlog.get_logger("pool")

Backend = TextBackend | ImageBackend
BackendLoader = Callable[[ModelSpec, ModelSource, str], Backend]
Admitter = Callable[[ModelSource, Capability], Decision]


@dataclass(frozen=True)
class PoolLimits:
    budget_bytes: int  # host memory
    device_budget_bytes: int | None = None  # GPU memory; None: no limit
    max_models: int | None = None
    keep_alive: float = 0.0  # seconds; 0 keeps idle models until evicted
    load_wait: float = 30.0
    # Generations that may wait for a place in a text model's batch.
    max_waiting_sequences: int = 64


@dataclass
class LoadedModel:
    spec: ModelSpec
    backend: Backend
    worker: ModelWorker
    memory_bytes: int  # host memory
    capability: Capability
    device_bytes: int = 0  # GPU memory
    last_used: float = field(default_factory=time.time)
    active_requests: int = 0
    # Set when the backend failed mid-request; the model is then out of the pool.
    broken: bool = False
    # A text model's decode loop, batching its concurrent generations.
    scheduler: DecodeScheduler | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    def ensure_usable(self) -> None:
        """Call on the worker before using the backend: it may have failed meanwhile."""
        if self.broken:  # a request ahead of this one broke it while this one waited
            raise Unavailable(f"model {self.name!r} is being reloaded after a failure; retry")

    @property
    def text(self) -> TextBackend:
        if self.capability is not Capability.TEXT:
            raise NotSupported(f"model {self.name!r} generates images; call GenerateImage")
        return cast(TextBackend, self.backend)

    @property
    def decoder(self) -> DecodeScheduler:
        if self.scheduler is None:
            raise NotSupported(f"model {self.name!r} generates images; call GenerateImage")
        return self.scheduler

    @property
    def image(self) -> ImageBackend:
        if self.capability is not Capability.IMAGE:
            raise NotSupported(f"model {self.name!r} generates text; call Generate")
        return cast(ImageBackend, self.backend)


@dataclass(frozen=True)
class Plan:
    """What loading a model of `need` host bytes and `device_need` GPU bytes would do now."""

    need: int
    fits_at_all: bool
    evict: tuple[str, ...]  # idle models to unload, least recently used first
    blocked_by_busy: bool  # room exists only once busy models finish
    device_need: int = 0


@dataclass
class PoolStats:
    loads: dict[str, int] = field(default_factory=dict)
    load_seconds: dict[str, float] = field(default_factory=dict)  # summed over loads
    evictions: list[str] = field(default_factory=list)


def memory_need(decision: Decision, spec: ModelSpec) -> MemoryNeed:
    """What loading `spec` takes: weights and KV cache and, for llama.cpp on the CPU
    keeping more than one finished conversation, up to one more KV cache's worth of
    host memory for the parked ones (see kv_slots; on a GPU none are parked). A
    per-sequence KV layout has a cache for every running and cached sequence, and
    parks nothing; a unified one is one pool of --context-size cells."""
    if decision.backend != LLAMA_CPP:
        return decision.memory(spec.context_size, spec.gpu_layers)
    if spec.kv_layout == "per-sequence":
        sequences = spec.parallel_sequences + spec.cached_sequences
        return decision.memory(spec.context_size, spec.gpu_layers, sequences)
    need = decision.memory(spec.context_size, spec.gpu_layers, pooled=True)
    if spec.cached_sequences > 1 and not need.device_bytes:
        return dataclasses.replace(need, parked_bytes=need.kv_cache_bytes)
    return need


class ModelPool:
    def __init__(
        self,
        catalog: Catalog,
        admitter: Admitter,
        loader: BackendLoader,
        limits: PoolLimits,
    ) -> None:
        self.catalog = catalog
        self.limits = limits
        self.stats = PoolStats()
        self._admit = admitter
        self._loader = loader
        self._loaded: dict[str, LoadedModel] = {}  # least recently used first
        self._load_lock = asyncio.Lock()
        self._released = asyncio.Condition()
        self._housekeeping: asyncio.Task[None] | None = None

    # --- what is loaded ------------------------------------------------------------

    def loaded(self) -> list[LoadedModel]:
        return list(self._loaded.values())

    def used_bytes(self) -> int:
        return sum(model.memory_bytes for model in self._loaded.values())

    def used_device_bytes(self) -> int:
        return sum(model.device_bytes for model in self._loaded.values())

    def plan(self, need: int, name: str = "", device_need: int = 0) -> Plan:
        """Which idle models would go to make room for a model (nothing changes).

        `need` is host bytes, `device_need` GPU bytes.
        """
        device_budget = self.limits.device_budget_bytes
        over_device = device_budget is not None and device_need > device_budget
        if need > self.limits.budget_bytes or over_device:
            return Plan(need, False, evict=(), blocked_by_busy=False, device_need=device_need)
        others = [m for m in self._loaded.values() if m.name != name]
        free = self.limits.budget_bytes - sum(m.memory_bytes for m in others)
        device_free = (
            None if device_budget is None else device_budget - sum(m.device_bytes for m in others)
        )
        slots = None if self.limits.max_models is None else self.limits.max_models - len(others)

        def enough() -> bool:
            device_ok = device_free is None or device_free >= device_need
            return free >= need and device_ok and (slots is None or slots >= 1)

        evict: list[str] = []
        for model in others:  # least recently used first
            if enough():
                break
            if model.active_requests == 0:
                evict.append(model.name)
                free += model.memory_bytes
                device_free = None if device_free is None else device_free + model.device_bytes
                slots = None if slots is None else slots + 1
        return Plan(need, True, tuple(evict), blocked_by_busy=not enough(), device_need=device_need)

    # --- using a model ------------------------------------------------------------

    @asynccontextmanager
    async def use(
        self, name: str, capability: Capability = Capability.TEXT
    ) -> AsyncIterator[LoadedModel]:
        """The loaded model for `name`, loading it if needed, held for one request.

        An exception other than a ServiceError leaving the block means the library
        failed inside the model, whose state is then unknown: the model is
        discarded and the request gets INTERNAL saying so.
        """
        model = await self.get(name, capability)
        model.active_requests += 1
        try:
            yield model
        except ServiceError:
            raise
        except Exception as exc:
            failure = f"{type(exc).__name__}: {exc}"
            await self.discard(model, failure)
            raise BackendFailure(
                f"model {model.name!r} failed while generating ({failure}); it was unloaded, "
                "and the next request loads it afresh"
            ) from exc
        finally:
            model.active_requests -= 1
            model.last_used = time.time()
            await self._after_release(model)

    async def get(self, name: str, capability: Capability = Capability.TEXT) -> LoadedModel:
        spec = self.catalog.resolve(name)
        model = self._loaded.get(spec.name)
        if model is not None:
            self._touch(model)
            return model
        async with self._load_lock:
            model = self._loaded.get(spec.name)
            if model is not None:
                self._touch(model)
                return model
            return await self._admit_and_load(spec, capability)

    async def admission(self, spec: ModelSpec, capability: Capability) -> Decision:
        """Admission for a spec, computed off the event loop (it reads files)."""
        source = await asyncio.to_thread(spec.locate)
        return await asyncio.to_thread(self._admit, source, capability)

    async def discard(self, model: LoadedModel, why: str) -> None:
        """Take a broken model out of the pool; it is closed when its last user leaves."""
        if model.broken:
            return
        model.broken = True
        if self._loaded.get(model.name) is model:
            del self._loaded[model.name]
        log.warning("model discarded", model=model.name, reason=why)
        await self._after_release(model)

    # --- loading and unloading ----------------------------------------------------

    async def _admit_and_load(self, spec: ModelSpec, capability: Capability) -> LoadedModel:
        source = await asyncio.to_thread(spec.locate)
        decision = await asyncio.to_thread(self._admit, source, capability)
        if not decision.admitted:
            raise NotSupported(f"model {spec.name!r} cannot be served: {decision.reason}")
        need = memory_need(decision, spec)
        await self._make_room(spec.name, need.host_bytes, need.device_bytes)
        worker = ModelWorker(spec.name)
        started = time.monotonic()
        try:
            backend = await worker.call(lambda: self._loader(spec, source, decision.backend))
        except BaseException:
            worker.shutdown()
            raise
        seconds = time.monotonic() - started
        self.stats.load_seconds[spec.name] = self.stats.load_seconds.get(spec.name, 0.0) + seconds
        model = LoadedModel(
            spec,
            backend,
            worker,
            memory_bytes=need.host_bytes,
            capability=capability,
            device_bytes=need.device_bytes,
        )
        if capability is Capability.TEXT:
            text = cast(TextBackend, backend)
            model.scheduler = DecodeScheduler(
                text, worker, self.limits.max_waiting_sequences, model.spec.stream_interval
            )
        self._loaded[spec.name] = model
        self.stats.loads[spec.name] = self.stats.loads.get(spec.name, 0) + 1
        log.info(
            "model loaded",
            model=spec.name,
            backend=backend.name,
            memory=format_bytes(need.host_bytes),
            gpu_memory=format_bytes(need.device_bytes),
        )
        return model

    async def _make_room(self, name: str, need: int, device_need: int = 0) -> None:
        deadline = time.monotonic() + self.limits.load_wait
        while True:
            plan = self.plan(need, name, device_need)
            if not plan.fits_at_all:
                raise Overloaded(f"model {name!r} {too_big(plan, self.limits)}")
            if not plan.blocked_by_busy:
                for victim in plan.evict:
                    await self._unload(self._loaded[victim], "evicted to make room")
                return
            # Evicting idle models would not be enough: evict nothing until it is.
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not await self._wait_for_release(remaining):
                busy = [m.name for m in self._loaded.values() if m.active_requests]
                on_gpu = f" and {format_bytes(device_need)} of GPU memory" if device_need else ""
                raise Overloaded(
                    f"model {name!r} needs about {format_bytes(need)}{on_gpu} and the memory is "
                    f"held by models serving requests ({', '.join(busy)}); waited "
                    f"{self.limits.load_wait:g} s for them to finish. Retry later."
                )

    async def _wait_for_release(self, timeout: float) -> bool:
        async with self._released:
            try:
                await asyncio.wait_for(self._released.wait(), timeout)
            except TimeoutError:
                return False
        return True

    async def _after_release(self, model: LoadedModel) -> None:
        if model.broken and model.active_requests == 0:
            await self._close(model)
        async with self._released:
            self._released.notify_all()

    async def _unload(self, model: LoadedModel, why: str) -> None:
        del self._loaded[model.name]
        self.stats.evictions.append(model.name)
        log.info("model unloaded", model=model.name, reason=why)
        await self._close(model)

    async def _close(self, model: LoadedModel) -> None:
        scheduler = model.scheduler
        try:
            if scheduler is not None:  # nothing may step a closed backend
                await model.worker.call(lambda: scheduler.abort(f"model {model.name!r} unloaded"))
            await model.worker.call(model.backend.close)
        finally:
            model.worker.shutdown()

    def _touch(self, model: LoadedModel) -> None:
        self._loaded.pop(model.name)
        self._loaded[model.name] = model  # most recently used last

    # --- keep-alive -----------------------------------------------------------------

    def start_housekeeping(self) -> None:
        if self.limits.keep_alive > 0:
            self._housekeeping = asyncio.create_task(self._unload_idle_forever())

    async def unload_idle(self) -> list[str]:
        """Unload models idle longer than the keep-alive, except the default model."""
        cutoff = time.time() - self.limits.keep_alive
        idle = [
            model
            for model in self._loaded.values()
            if model.active_requests == 0
            and model.last_used < cutoff
            and model.name != self.catalog.default_model
        ]
        async with self._load_lock:
            for model in idle:
                if self._loaded.get(model.name) is model and model.active_requests == 0:
                    await self._unload(model, f"idle for {self.limits.keep_alive:g} s")
        return [model.name for model in idle]

    async def _unload_idle_forever(self) -> None:
        period = min(max(self.limits.keep_alive / 4, 0.05), 30.0)
        while True:
            await asyncio.sleep(period)
            await self.unload_idle()

    async def close(self) -> None:
        if self._housekeeping is not None:
            self._housekeeping.cancel()
        models, self._loaded = list(self._loaded.values()), {}
        for model in models:
            await self._close(model)


def too_big(plan: Plan, limits: PoolLimits) -> str:
    """Why a model that does not fit at all does not, naming the budget it exceeds."""
    if plan.need > limits.budget_bytes:
        return (
            f"needs about {format_bytes(plan.need)} of memory, more than the whole memory "
            f"budget of {format_bytes(limits.budget_bytes)}; raise --memory-budget or use a "
            "smaller context size or quantization"
        )
    return (
        f"needs about {format_bytes(plan.device_need)} of GPU memory, more than the whole GPU "
        f"memory budget of {format_bytes(limits.device_budget_bytes or 0)}; raise "
        "--gpu-memory-budget or offload fewer layers (--gpu-layers)"
    )
