"""The models loaded now: an LRU under a memory budget, each model in an engine of its own.

- A model is admitted (see `service.admission`) before it is loaded, and its
  memory estimated from metadata: host memory, budgeted against `budget_bytes`,
  and the GPU memory of the layers llama.cpp offloads, budgeted against
  `device_budget_bytes` when one is set.
- Loading evicts least-recently-used idle models until the new one fits. A
  model with a request in progress is never evicted; a load waits up to
  `load_wait` seconds for one to go idle, then fails with RESOURCE_EXHAUSTED.
- A model has at most one load in progress: concurrent requests for it share
  that load and its outcome; after a failed load the next request tries again.
- Loads of different models run side by side. A load reserves its estimate as
  soon as it has room, before it evicts or loads anything; every plan counts
  reservations, and models out of the pool but not yet closed, as busy. So the
  budget arithmetic holds without a lock, and a load that fits in what is free
  goes ahead at once while another waits for busy models. Waiting loads look
  again whenever a request ends, a load ends, or a model is closed.
- A model whose library failed mid-request is discarded: new requests load a
  fresh copy, and the broken one is closed once its last user leaves (its
  memory counts until then). Other exceptions pass through untouched: the
  model stays (see `service.backends.failure`).
- A model whose engine process died is discarded the same way, and the crash
  recorded: a model that crashed `crash_limit` times within `crash_window`
  seconds is refused with FAILED_PRECONDITION until the oldest of those
  crashes leaves the window (see `service.engine.crash_backoff`).
- Idle models are unloaded after `keep_alive` seconds, except the default.
- An image model counts what its engine process holds, measured once it is
  loaded and whenever it goes idle, when that is more than its estimate: the
  estimate is the weights, and torch and the pipeline's buffers hold far more
  (a 6 MiB pipeline's engine holds about 500 MiB). An image's working memory
  is reserved apart while it renders (`working_memory`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import structlog

from service.admission import Capability, Decision, not_downloaded
from service.admission.gates import llama_cpp_computes_on_gpu
from service.backends.names import (
    EXTERNAL,
    LLAMA_CPP,
    KvCacheLayout,
    batch_size_on,
    kv_layout_on,
)
from service.engine.base import Engine, EngineCrashed, EngineHooks
from service.engine.crash_backoff import CrashHistory
from service.errors import NotSupported, Overloaded, ServiceError
from service.hub.work import HubWork
from service.memory import MemoryNeed, format_bytes
from service.model_source import ModelSource
from service.models.catalog import Catalog, ModelSpec

log = structlog.get_logger("pool")

# Seconds an answer of `unloadable_reasons` is kept.
_UNLOADABLE_KEPT = 10.0

# Starts a model's engine with its backend, as admission chose it.
EngineStarter = Callable[[ModelSpec, ModelSource, str, EngineHooks], Awaitable[Engine]]
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
    # Crashes of one model's engine within crash_window seconds that make the
    # pool refuse it until the oldest leaves the window; 0: never refuse.
    crash_limit: int = 3
    crash_window: float = 600.0


@dataclass(eq=False)  # models are told apart by identity: a reload is another model
class LoadedModel:
    spec: ModelSpec
    engine: Engine
    memory_bytes: int  # host memory: the estimate, or what was measured when more
    capability: Capability
    device_bytes: int = 0  # GPU memory, likewise
    last_used: float = field(default_factory=time.time)
    active_requests: int = 0
    # Requests that waited for this model's load and have not yet taken it up: it is
    # theirs, not idle, however soon another load looks for room (see ModelPool.get).
    claims: int = 0
    # The file or folder it was loaded from (a hub model's, under its snapshot).
    path: str | None = None
    # Set when the backend failed mid-request or its engine died; the model is
    # then out of the pool.
    broken: bool = False
    # Set once its closing began; it serves nothing after.
    closing: bool = False
    # The estimates from metadata, which the measured figures never go below.
    estimated_bytes: int = field(init=False)
    estimated_device_bytes: int = field(init=False)

    def __post_init__(self) -> None:
        self.estimated_bytes = self.memory_bytes
        self.estimated_device_bytes = self.device_bytes

    @property
    def idle(self) -> bool:
        """Serving nothing and claimed by no request: a model eviction may take."""
        return self.active_requests == 0 and self.claims == 0

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def backend_name(self) -> str:
        return self.engine.info.backend

    def require(self, capability: Capability) -> Engine:
        """Its engine, or NotSupported when the model does not do what was asked."""
        if capability is not self.capability:
            does = {
                Capability.TEXT: "generates text; call Generate",
                Capability.IMAGE: "generates images; call GenerateImage",
                Capability.EMBED: "gives embeddings; call Embed",
            }
            raise NotSupported(f"model {self.name!r} {does[self.capability]}")
        return self.engine


@dataclass(frozen=True)
class Plan:
    """What loading a model of `need` host bytes and `device_need` GPU bytes would do now."""

    need: int
    fits_at_all: bool
    evict: tuple[str, ...]  # idle models to unload, least recently used first
    blocked_by_busy: bool  # room exists only once busy models finish
    device_need: int = 0


@dataclass(eq=False)
class _Load:
    """A model's load in progress: the task every request for the model awaits, and
    the memory reserved for it (nothing until it has room)."""

    name: str
    task: asyncio.Task[None] | None = None
    host_bytes: int = 0
    device_bytes: int = 0
    waiting_for_memory: bool = False
    # Requests awaiting it now, and the model it made once it ended.
    waiters: int = 0
    model: LoadedModel | None = None
    # Set once the load has its memory and its engine is starting.
    engine_starting: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class PoolStats:
    loads: dict[str, int] = field(default_factory=dict)
    load_seconds: dict[str, float] = field(default_factory=dict)  # summed over loads
    # Counts by model name: bounded by the models there are, not by the events.
    evictions: Counter[str] = field(default_factory=Counter)
    crashes: Counter[str] = field(default_factory=Counter)  # engine crashes
    # The last evictions in order, oldest first (for people and tests; bounded).
    recent_evictions: deque[str] = field(default_factory=lambda: deque(maxlen=100))


def kv_cache_layout(decision: Decision, spec: ModelSpec) -> KvCacheLayout | None:
    """The KV cache layout a llama.cpp model will get (None for other backends): "auto"
    settled as the backend settles it, by whether its layers compute on a GPU."""
    if decision.backend != LLAMA_CPP:
        return None
    return kv_layout_on(spec.options.kv_layout, _on_gpu(decision, spec))


def _on_gpu(decision: Decision, spec: ModelSpec) -> bool:
    """Whether a llama.cpp model's layers will compute on a GPU, as the backend decides."""
    offloads = decision.offloads or llama_cpp_computes_on_gpu()
    return spec.options.gpu_layers != 0 and offloads


def memory_need(decision: Decision, spec: ModelSpec) -> MemoryNeed:
    """What loading `spec` takes: weights, KV cache, on a GPU llama.cpp's compute buffer
    for the step size it will get (see `batch_size_on`) and, for llama.cpp on the CPU
    keeping more than one finished conversation, up to one more KV cache's worth of
    host memory for the parked ones (see kv_slots; on a GPU none are parked). A
    per-sequence KV layout has a cache for every running and cached sequence, and
    parks nothing; a unified one is one pool of --context-size cells."""
    options = spec.options
    layout = kv_cache_layout(decision, spec)
    if layout is None:
        return decision.memory(options.context_size, options.gpu_layers)
    batch = batch_size_on(options.batch_size, _on_gpu(decision, spec))
    if layout == "per-sequence":
        sequences = options.parallel_sequences + options.cached_sequences
        return decision.memory(
            options.context_size, options.gpu_layers, sequences, batch_size=batch
        )
    need = decision.memory(options.context_size, options.gpu_layers, pooled=True, batch_size=batch)
    if options.cached_sequences > 1 and not need.device_bytes:
        return dataclasses.replace(need, parked_bytes=need.kv_cache_bytes)
    return need


class ModelPool:
    def __init__(
        self,
        catalog: Catalog,
        admitter: Admitter,
        starter: EngineStarter,
        limits: PoolLimits,
        hub_work: HubWork | None = None,
    ) -> None:
        self.catalog = catalog
        # Admission that asks the hub runs here, never on the threads loads use.
        self._hub_work = hub_work or HubWork()
        self.limits = limits
        self.stats = PoolStats()
        self.crashes = CrashHistory(limits.crash_limit, limits.crash_window)
        # Told the name of a model whose engine died (the server reloads the default),
        # and of each model loaded (the server's health follows the default's).
        self.on_engine_exit: Callable[[str], None] = _nobody
        self.on_loaded: Callable[[str], None] = _nobody
        self._admit = admitter
        self._start_engine = starter
        self._loaded: dict[str, LoadedModel] = {}  # least recently used first
        self._loading: dict[str, _Load] = {}
        # Memory requests need beyond their model's while they run (an image's activations).
        self._working: dict[int, _Load] = {}
        # Out of the pool, still in memory: evicted ones closing, broken ones in use.
        self._leaving: dict[int, LoadedModel] = {}
        # Set, and replaced, whenever memory may have been freed (see `_changed`).
        self._change = asyncio.Event()
        self._background: set[asyncio.Task[Any]] = set()
        self._housekeeping: asyncio.Task[None] | None = None
        # unloadable_reasons' answers: (when, the spec judged, why; "" for nothing).
        self._unloadable: dict[str, tuple[float, ModelSpec, str]] = {}

    # --- what is loaded ------------------------------------------------------------

    def loaded(self) -> list[LoadedModel]:
        return list(self._loaded.values())

    def loading(self) -> list[str]:
        """Models being loaded now, waiting for memory or not."""
        return list(self._loading)

    def waiting_for_memory(self) -> list[str]:
        """Loads waiting for busy models to finish before they fit."""
        return [load.name for load in self._loading.values() if load.waiting_for_memory]

    def used_bytes(self) -> int:
        """Host memory held: loaded models, loads in progress, models not yet closed."""
        return sum(m.memory_bytes for m in self._loaded.values()) + self._held("")[0]

    def used_device_bytes(self) -> int:
        return sum(m.device_bytes for m in self._loaded.values()) + self._held("")[1]

    def _held(self, name: str) -> tuple[int, int, int]:
        """(host bytes, GPU bytes, models) held outside `_loaded` and not by `name`'s own
        load: reservations of loads in progress and models leaving. None is evictable."""
        reservations = [*self._loading.values(), *self._working.values()]
        loads = [load for load in reservations if load.name != name]
        leaving = list(self._leaving.values())
        host = sum(load.host_bytes for load in loads) + sum(m.memory_bytes for m in leaving)
        device = sum(load.device_bytes for load in loads) + sum(m.device_bytes for m in leaving)
        reserved = sum(1 for load in loads if load.host_bytes or load.device_bytes)
        return host, device, reserved + len(leaving)

    def plan(self, need: int, name: str = "", device_need: int = 0) -> Plan:
        """Which idle models would go to make room for a model (nothing changes).

        `need` is host bytes, `device_need` GPU bytes.
        """
        device_budget = self.limits.device_budget_bytes
        over_device = device_budget is not None and device_need > device_budget
        if need > self.limits.budget_bytes or over_device:
            return Plan(need, False, evict=(), blocked_by_busy=False, device_need=device_need)
        others = [m for m in self._loaded.values() if m.name != name]
        held, device_held, held_models = self._held(name)
        free = self.limits.budget_bytes - sum(m.memory_bytes for m in others) - held
        device_free = (
            None
            if device_budget is None
            else device_budget - sum(m.device_bytes for m in others) - device_held
        )
        slots = (
            None
            if self.limits.max_models is None
            else self.limits.max_models - len(others) - held_models
        )

        def enough() -> bool:
            device_ok = device_free is None or device_free >= device_need
            return free >= need and device_ok and (slots is None or slots >= 1)

        evict: list[str] = []
        for model in others:  # least recently used first
            if enough():
                break
            if model.idle:
                evict.append(model.name)
                free += model.memory_bytes
                device_free = None if device_free is None else device_free + model.device_bytes
                slots = None if slots is None else slots + 1
        return Plan(need, True, tuple(evict), blocked_by_busy=not enough(), device_need=device_need)

    def unloadable_reasons(self, specs: list[ModelSpec]) -> dict[str, str]:
        """Why each model can never be loaded here as configured, by name (absent when
        nothing is known against it). Reads metadata: call it off the event loop. Each
        answer is kept a few seconds: ListModels is polled (by the picker, twice a
        second), and a model's files and the budget rarely change."""
        now = time.monotonic()
        reasons: dict[str, str] = {}
        for spec in specs:
            kept = self._unloadable.get(spec.name)
            if kept is None or now - kept[0] > _UNLOADABLE_KEPT or kept[1] is not spec:
                try:
                    reason = self.unloadable_reason(spec)
                except Exception:  # one model's surprise must not fail the whole list
                    log.exception("judging whether a model can load failed", model=spec.name)
                    reason = ""
                kept = self._unloadable[spec.name] = (now, spec, reason)
            if kept[2]:
                reasons[spec.name] = kept[2]
        return reasons

    def unloadable_reason(self, spec: ModelSpec) -> str:
        """Why `spec` can never be loaded here as configured, known without loading or
        writing anything: it cannot be located, admission refuses its files, or it
        needs more memory than the whole budget by the estimate a load uses. Empty when
        nothing is known against it (a hub model not on disk is judged when pulled;
        the external image command's models are not judged here)."""
        if spec.backend == EXTERNAL:
            return ""
        try:
            source = spec.locate()
        except ServiceError as exc:
            return exc.message
        if not source.available_locally:
            return ""
        capability = Capability.EMBED if spec.embeds else Capability.TEXT
        if source.kind == "diffusers":
            capability = Capability.IMAGE
        decision = self._admit(source, capability)
        described = decision.description
        if not decision.admitted and described is not None and described.pooling:
            decision = self._admit(source, Capability.EMBED)  # an embedding model, configured
        if not decision.admitted:
            return decision.reason
        need = memory_need(decision, spec)
        plan = self.plan(need.host_bytes, spec.name, need.device_bytes)
        return "" if plan.fits_at_all else too_big(plan, self.limits)

    # --- using a model ------------------------------------------------------------

    @asynccontextmanager
    async def use(
        self, name: str, capability: Capability = Capability.TEXT
    ) -> AsyncIterator[LoadedModel]:
        """The loaded model for `name`, loading it if needed, held for one request.

        Exceptions leave the block as they came: a library failure was already
        turned into BackendFailure where it happened, and the model discarded if
        its state is unknown (see `LoadedModel.report_failure`).
        """
        model = await self.get(name, capability)
        model.active_requests += 1
        try:
            yield model
        finally:
            model.active_requests -= 1
            model.last_used = time.time()
            await self._after_release(model)

    @asynccontextmanager
    async def working_memory(self, need: int, what: str) -> AsyncIterator[None]:
        """Reserve `need` host bytes in the budget while a request runs (its working
        memory, beyond its model's weights), evicting idle models as a load would, or
        waiting for busy ones up to --load-wait; RESOURCE_EXHAUSTED if it cannot fit."""
        reservation = _Load(name=what)
        key = id(reservation)
        self._working[key] = reservation
        try:
            await self._make_room(reservation, need)
            yield
        finally:
            del self._working[key]
            self._changed()

    async def get(self, name: str, capability: Capability = Capability.TEXT) -> LoadedModel:
        spec = await self._resolve(name)
        while True:
            model = self._loaded.get(spec.name)
            if model is not None:
                self._touch(model)
                return model
            load = self._loading.get(spec.name) or self._start_load(spec, capability)
            assert load.task is not None  # set when the load started
            # Shielded: a request that goes away leaves the load to the others. The
            # model is claimed for each request that awaited it until that request
            # looks again: a load waiting for room could otherwise evict it first, and
            # two requests for two models that do not fit together would evict each
            # other's model for ever.
            load.waiters += 1
            try:
                await asyncio.shield(load.task)
            finally:
                load.waiters -= 1
                if load.model is not None:
                    load.model.claims -= 1

    async def load_begins(self, name: str, capability: Capability = Capability.TEXT) -> str | None:
        """For a model that is not loaded: start its load (or join the one under way)
        and wait until it has its memory and its engine is starting, then give the
        model's name, for the caller to tell its client that it waits for a load.
        None when it is loaded, or when the load ended first (`use` then has it).
        A load that failed before its engine started raises its error here, so that
        `use` does not try it again."""
        spec = await self._resolve(name)
        if spec.name in self._loaded:
            return None
        load = self._loading.get(spec.name) or self._start_load(spec, capability)
        assert load.task is not None
        starting = asyncio.ensure_future(load.engine_starting.wait())
        try:  # asyncio.wait leaves the load running if this request goes away
            await asyncio.wait((starting, load.task), return_when=asyncio.FIRST_COMPLETED)
        finally:
            starting.cancel()
        if load.task.done():
            load.task.result()  # its error, if it failed
            return None
        return spec.name

    async def _resolve(self, name: str) -> ModelSpec:
        """The spec for `name`: a dict lookup for configured names; a reference is
        resolved off the event loop (it reads the disk and the hub cache)."""
        spec = self.catalog.configured(name)
        if spec is not None:
            return spec
        return await asyncio.to_thread(self.catalog.resolve, name)

    async def admission(
        self, spec: ModelSpec, capability: Capability, *, from_hub: bool = False
    ) -> Decision:
        """Admission for a spec, computed off the event loop (it reads files). `from_hub`:
        a hub model is judged from the hub's listing even when a copy is cached, so
        the answer carries the hashes that copy is checked against."""
        source = await asyncio.to_thread(spec.locate)
        if from_hub and source.hub is not None:
            source = dataclasses.replace(source, path=None)
        if source.hub is not None and source.path is None:  # the hub's metadata is read
            return await self._hub_work.run(self._admit, source, capability)
        return await asyncio.to_thread(self._admit, source, capability)

    async def discard(self, model: LoadedModel, why: str) -> None:
        """Take a broken model out of the pool; it is closed when its last user leaves."""
        if self._discard_now(model, why):
            await self._after_release(model)

    def _discard_now(self, model: LoadedModel, why: str) -> bool:
        """Mark it broken and out of the pool at once; whether it was not already."""
        if model.broken:
            return False
        model.broken = True
        if self._loaded.get(model.name) is model:
            del self._loaded[model.name]
        if not model.closing:
            self._leaving[id(model)] = model
        log.warning("model discarded", model=model.name, reason=why)
        return True

    def _discard_soon(self, model: LoadedModel, why: str) -> None:
        """`discard`, from a callback on the event loop."""
        if self._discard_now(model, why):
            task = asyncio.create_task(self._after_release(model))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    # --- loading and unloading ----------------------------------------------------

    def _start_load(self, spec: ModelSpec, capability: Capability) -> _Load:
        load = self._loading[spec.name] = _Load(spec.name)
        load.task = asyncio.create_task(self._run_load(load, spec, capability))
        load.task.add_done_callback(_retrieve)
        return load

    async def _run_load(self, load: _Load, spec: ModelSpec, capability: Capability) -> None:
        try:
            model = await self._admit_and_load(load, spec, capability)
            self._loaded[spec.name] = model  # in the same step the reservation goes
            model.claims, load.model = load.waiters, model
            self.on_loaded(spec.name)
        finally:
            del self._loading[spec.name]
            self._changed()

    async def _admit_and_load(
        self, load: _Load, spec: ModelSpec, capability: Capability
    ) -> LoadedModel:
        refusal = self.crashes.refusal(spec.name)
        if refusal is not None:
            raise NotSupported(refusal)
        source = await asyncio.to_thread(spec.locate)
        if not source.available_locally:
            # Admission would ask the hub about it; loading needs the files here.
            raise NotSupported(f"model {spec.name!r} cannot be served: {not_downloaded(source)}")
        decision = await asyncio.to_thread(self._admit, source, capability)
        if not decision.admitted:
            raise NotSupported(f"model {spec.name!r} cannot be served: {decision.reason}")
        need = memory_need(decision, spec)
        await self._make_room(load, need.host_bytes, need.device_bytes)
        if spec.prepare is not None:  # joining chunks: written only now that it fits
            source = await asyncio.to_thread(spec.prepare)
        loaded: list[LoadedModel] = []  # the hooks' model, once there is one

        def failed(why: str) -> None:
            for model in loaded:
                self._discard_soon(model, why)

        def died(cause: str) -> None:
            for model in loaded:
                self._engine_died(model, cause)

        hooks = EngineHooks(on_failure=failed, on_exit=died)
        load.engine_starting.set()
        started = time.monotonic()
        try:
            engine = await self._start_engine(spec, source, decision.backend, hooks)
        except EngineCrashed as crash:
            self._record_crash(spec.name, crash.cause)
            raise
        seconds = time.monotonic() - started
        self.stats.load_seconds[spec.name] = self.stats.load_seconds.get(spec.name, 0.0) + seconds
        model = LoadedModel(spec, engine, need.host_bytes, capability, need.device_bytes)
        model.path = str(source.path)
        loaded.append(model)
        self._measure(model)
        self.stats.loads[spec.name] = self.stats.loads.get(spec.name, 0) + 1
        log.info(
            "model loaded",
            model=spec.name,
            backend=engine.info.backend,
            engine_pid=engine.pid,
            seconds=round(seconds, 2),
            memory=format_bytes(model.memory_bytes),
            gpu_memory=format_bytes(need.device_bytes),
            kv_cache=format_bytes(need.kv_cache_bytes),
            kv_layout=kv_cache_layout(decision, spec),
        )
        return model

    def _engine_died(self, model: LoadedModel, cause: str) -> None:
        """Its engine process died: drop the model (the next request starts a fresh
        engine), count the crash, and tell the server."""
        self._record_crash(model.name, cause)
        self._discard_soon(model, f"its engine process ended: {cause}")
        self.on_engine_exit(model.name)

    def _record_crash(self, name: str, cause: str) -> None:
        self.crashes.record(name, cause)
        self.stats.crashes[name] += 1

    async def _make_room(self, load: _Load, need: int, device_need: int = 0) -> None:
        """Wait until `need` fits, then reserve it and evict what must go for it."""
        deadline = time.monotonic() + self.limits.load_wait
        try:
            while True:
                plan = self.plan(need, load.name, device_need)
                if not plan.fits_at_all:  # never will: not a reason to retry (a 429)
                    raise NotSupported(f"model {load.name!r} {too_big(plan, self.limits)}")
                if not plan.blocked_by_busy:
                    # Reserved before the first await, so no other plan counts it free.
                    load.host_bytes, load.device_bytes = need, device_need
                    await self._evict(plan.evict, "evicted to make room")
                    return
                # Evicting idle models would not be enough: evict nothing until it is.
                load.waiting_for_memory = True
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not await self._wait_for_change(remaining):
                    raise Overloaded(self._busy_message(load.name, need, device_need))
        finally:
            load.waiting_for_memory = False

    def _busy_message(self, name: str, need: int, device_need: int) -> str:
        busy = [m.name for m in self._loaded.values() if m.active_requests]
        busy += [
            load.name
            for load in self._loading.values()
            if load.name != name and (load.host_bytes or load.device_bytes)
        ]
        busy += [m.name for m in self._leaving.values()]
        on_gpu = f" and {format_bytes(device_need)} of GPU memory" if device_need else ""
        return (
            f"model {name!r} needs about {format_bytes(need)}{on_gpu} and the memory is "
            f"held by models serving requests, loading or closing ({', '.join(busy)}); "
            f"waited {self.limits.load_wait:g} s for them to finish. Retry later."
        )

    async def _wait_for_change(self, timeout: float) -> bool:
        """Wait until memory may have been freed; False when `timeout` passed first.

        The event is taken before the first await, so a change made after the
        caller's plan always wakes it.
        """
        change = self._change
        try:
            async with asyncio.timeout(timeout):  # wait_for can lose a cancel (3.11)
                await change.wait()
        except TimeoutError:
            return False
        return True

    def _changed(self) -> None:
        """Wake every waiting load: memory may have been freed."""
        self._change.set()
        self._change = asyncio.Event()

    async def _after_release(self, model: LoadedModel) -> None:
        if model.broken and model.active_requests == 0:
            await self._close_leaving(model)
        self._measure(model)
        self._changed()

    @staticmethod
    def _measure(model: LoadedModel) -> None:
        """An idle image model's figures from what its engine holds, when more than the
        estimate. Idle only: while an image renders its working memory is reserved apart,
        and counting it in the model too would refuse the next image beside it."""
        busy = model.active_requests or model.broken or model.closing
        if model.capability is not Capability.IMAGE or busy:
            return
        measured = model.engine.memory()
        if measured is None:  # in process: nothing apart to measure
            return
        model.memory_bytes = max(model.estimated_bytes, measured.rss_bytes)
        model.device_bytes = max(model.estimated_device_bytes, measured.gpu_bytes)

    async def _evict(self, names: tuple[str, ...] | list[str], why: str) -> None:
        """Take the models out of the pool at once, then close them one by one."""
        models = [self._loaded.pop(name) for name in names]
        for model in models:
            self._leaving[id(model)] = model
            self.stats.evictions[model.name] += 1
            self.stats.recent_evictions.append(model.name)
            log.info("model unloaded", model=model.name, reason=why)
        for model in models:
            await self._close_leaving(model)

    async def _close_leaving(self, model: LoadedModel) -> None:
        """Close a model out of the pool, once; its memory is free after.

        The closing runs as a task of its own, which `close` awaits: a load that
        evicted the model may be cancelled, but an engine must not be left half
        stopped.
        """
        if model.closing:
            return
        model.closing = True
        task = asyncio.create_task(self._close_and_forget(model))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        await asyncio.shield(task)

    async def _close_and_forget(self, model: LoadedModel) -> None:
        try:
            await self._close(model)
        except Exception:  # nothing more can be done for it; its memory is let go
            log.exception("closing a model failed", model=model.name)
        finally:
            self._leaving.pop(id(model), None)
            self._changed()

    @staticmethod
    async def _close(model: LoadedModel) -> None:
        await model.engine.close(f"model {model.name!r} unloaded")

    def _touch(self, model: LoadedModel) -> None:
        self._loaded.pop(model.name)
        self._loaded[model.name] = model  # most recently used last

    async def release_files(self, folder: str, why: str) -> list[str]:
        """Unload the models loaded from files under `folder` (their engines let go of
        the files); NotSupported naming those still serving requests, left loaded."""
        inside = folder.rstrip(os.sep) + os.sep
        using = [m for m in self._loaded.values() if (m.path or "").startswith(inside)]
        busy = [m for m in using if m.active_requests]
        if busy:
            names = ", ".join(f"{m.name!r} ({m.active_requests} requests)" for m in busy)
            raise NotSupported(
                f"{names} is loaded from these files and serving: {why} waits until it is "
                "idle; retry then"
            )
        await self._evict([m.name for m in using], why)
        return [m.name for m in using]

    # --- keep-alive -----------------------------------------------------------------

    def start_housekeeping(self) -> None:
        if self.limits.keep_alive > 0:
            self._housekeeping = asyncio.create_task(self._unload_idle_forever())

    async def unload_idle(self) -> list[str]:
        """Unload models idle longer than the keep-alive, except the default model."""
        cutoff = time.time() - self.limits.keep_alive
        idle = [
            model.name
            for model in self._loaded.values()
            if model.idle and model.last_used < cutoff and model.name != self.catalog.default_model
        ]
        await self._evict(idle, f"idle for {self.limits.keep_alive:g} s")
        return idle

    async def _unload_idle_forever(self) -> None:
        period = min(max(self.limits.keep_alive / 4, 0.05), 30.0)
        while True:
            await asyncio.sleep(period)
            await self.unload_idle()

    async def close(self) -> None:
        if self._housekeeping is not None:
            self._housekeeping.cancel()
        loads = [load.task for load in self._loading.values() if load.task is not None]
        for task in loads:
            task.cancel()
        # Awaited, so that no load or closing is left half done when the event loop
        # stops; a cancelled load may have started closing what it evicted.
        await asyncio.gather(*loads, return_exceptions=True)
        while self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        models = [*self._loaded.values(), *self._leaving.values()]
        self._loaded, self._leaving = {}, {}
        for model in models:
            if not model.closing:
                model.closing = True
                await self._close(model)


def _nobody(name: str) -> None:
    """The default `on_engine_exit`: nobody to tell."""


def _retrieve(task: asyncio.Task[None]) -> None:
    """Mark a load's failure as seen: the requests that awaited it got it already,
    and with none left it would be reported as never retrieved."""
    if not task.cancelled():
        task.exception()


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
