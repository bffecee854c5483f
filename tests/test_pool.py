"""The pool of loaded models: LRU under a memory budget, loads side by side, broken backends.

The policy (which model goes, which load waits, what is refused) is tested on the pool
itself, with real admission of the embedded models' files (their headers, and so their
real memory estimates) and a fake engine starter (`Engines`), as vLLM tests its
scheduler without a model: a load takes no time unless the test holds it, and what
was closed is recorded. The end-to-end tests at the bottom keep the real thing: real
engines over gRPC, and a real backend failing mid-forward.

A model is made busy by holding it through `pool.use` (`Held`): for the pool that is a
request in progress, and unlike a real stream it ends only when the test says so.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

import grpc
import pytest

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from service.admission import Capability, decide
from service.backends.llama_cpp import LlamaCppBackend
from service.config import ModelConfig, Settings
from service.decode.sequence import SequenceDecoder
from service.engine import core
from service.engine.base import EngineHooks, EngineInfo, MeasuredMemory
from service.engine.local import LocalEngine
from service.errors import INTERNAL_MESSAGE, ModelNotFound, NotSupported, Overloaded
from service.front import rpc, server
from service.model_source import ModelSource
from service.models.catalog import ModelSpec
from service.models.embedded import EMBEDDED_MODELS
from service.models.pool import ModelPool
from tests.conftest import (
    GEMMA,
    SMOLLM,
    RunningServer,
    collect,
    finished_of,
    make_settings,
    serving,
)

T = TypeVar("T")

SMALL = "gemma-small"  # the Gemma file again, under another name and context size
TINY = "smollm-small"  # the SmolLM file again, likewise
CONTEXT = 1024
SMALL_CONTEXT = 256
MiB = 1 << 20


def need(model: str, context: int) -> int:
    source = ModelSource("gguf", EMBEDDED_MODELS[model].locate())
    memory = decide(source, Capability.TEXT, offline=True).memory(context)
    # Weights, KV cache, and as much again for parked conversations (--cached-sequences > 1).
    return memory.total_bytes + memory.kv_cache_bytes


@pytest.fixture(scope="module")
def needs() -> dict[str, int]:
    return {
        SMOLLM: need(SMOLLM, CONTEXT),
        GEMMA: need(GEMMA, CONTEXT),
        SMALL: need(GEMMA, SMALL_CONTEXT),
        TINY: need(SMOLLM, SMALL_CONTEXT),
    }


def pool_settings(needs: dict[str, int], **overrides: Any) -> Settings:
    """Room for the two embedded models, not for a third."""
    gemma_path = str(EMBEDDED_MODELS[GEMMA].locate())
    smollm_path = str(EMBEDDED_MODELS[SMOLLM].locate())
    settings: dict[str, Any] = {
        "context_size": CONTEXT,
        # Both embedded models fit; a third does not, and evicting SmolLM alone
        # (smaller than gemma-small) would not make room for gemma-small either.
        "memory_budget": needs[SMOLLM] + needs[GEMMA] + (needs[SMALL] - needs[SMOLLM]) // 2,
        "models": {
            SMALL: ModelConfig(source=gemma_path, context_size=SMALL_CONTEXT),
            TINY: ModelConfig(source=smollm_path, context_size=SMALL_CONTEXT),
        },
        "load_wait": 0.5,
    }
    settings.update(overrides)
    return make_settings(**settings)


# --- the policy, on fake engines ----------------------------------------------------------


@dataclass(eq=False)
class FakeEngine:
    """What the pool sees of an engine, and nothing behind it: it serves no request."""

    name: str
    info: EngineInfo
    hooks: EngineHooks
    pid: int | None = None
    running: int = 0
    waiting: int = 0
    closed: str | None = None

    def generate(self, request: Any, received_at: float) -> Any:
        raise AssertionError("the pool's tests never generate")

    def generate_image(self, request: Any, received_at: float) -> Any:
        raise AssertionError("the pool's tests never generate")

    def memory(self) -> MeasuredMemory | None:
        return None

    async def close(self, reason: str) -> None:
        self.closed = reason


@dataclass
class Engines:
    """The pool's engine starter: fake engines, started at once unless a test holds a
    model's load (`hold`) until it lets it go (`release`)."""

    started: list[FakeEngine] = field(default_factory=list)
    _held: dict[str, asyncio.Event] = field(default_factory=dict)

    async def __call__(
        self, spec: ModelSpec, source: ModelSource, backend: str, hooks: EngineHooks
    ) -> FakeEngine:
        gate = self._held.get(spec.name)
        if gate is not None:
            await gate.wait()
        engine = FakeEngine(spec.name, EngineInfo(backend, spec.options.context_size), hooks)
        self.started.append(engine)
        return engine

    def hold(self, model: str) -> None:
        self._held[model] = asyncio.Event()

    def release(self, model: str) -> None:
        self._held.pop(model).set()

    def of(self, model: str) -> list[FakeEngine]:
        return [engine for engine in self.started if engine.name == model]


@pytest.fixture
def engines(monkeypatch: pytest.MonkeyPatch) -> Engines:
    """The engine starter the server's pool gets: fake engines (see `fake_pool`)."""
    fake = Engines()
    monkeypatch.setattr(server, "engine_starter", lambda settings: fake)
    return fake


def fake_pool(settings: Settings) -> ModelPool:
    """The pool the server builds for these settings (catalog, limits, admission), its
    engines from `engines`."""
    return server.build_pool(settings)


class Held:
    """A request in progress on `model` as the pool sees it, until `release()`."""

    def __init__(self, pool: ModelPool, model: str) -> None:
        self._pool, self._model = pool, model
        self._release = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Held:
        holding = asyncio.Event()

        async def user() -> None:
            async with self._pool.use(self._model):
                holding.set()
                await self._release.wait()

        self._task = asyncio.create_task(user())
        await holding.wait()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.release()

    async def release(self) -> None:
        self._release.set()
        assert self._task is not None
        await self._task


def run(scenario: Callable[[], Coroutine[Any, Any, T]]) -> T:
    return asyncio.run(scenario())


async def use(pool: ModelPool, model: str) -> None:
    """One request's use of `model`, loading it if need be."""
    async with pool.use(model):
        pass


def loaded(pool: ModelPool) -> set[str]:
    return {model.name for model in pool.loaded()}


async def eventually(condition: Callable[[], bool]) -> bool:
    """Whether `condition` holds within a minute: a bound on a hang, not on speed."""
    deadline = time.monotonic() + 60
    while not condition() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    return condition()


def test_least_recently_used_idle_model_is_evicted(needs: dict[str, int], engines: Engines) -> None:

    async def scenario() -> None:
        pool = fake_pool(pool_settings(needs))
        await use(pool, GEMMA)
        await use(pool, SMOLLM)  # now Gemma is the least recently used
        assert loaded(pool) == {SMOLLM, GEMMA}
        assert pool.plan(needs[SMALL], SMALL).evict == (GEMMA,)
        await use(pool, SMALL)
        assert loaded(pool) == {SMOLLM, SMALL}
        assert list(pool.stats.recent_evictions) == [GEMMA]
        assert engines.of(GEMMA)[0].closed == f"model {GEMMA!r} unloaded"
        (small,) = [m for m in pool.loaded() if m.name == SMALL]
        assert small.memory_bytes == needs[SMALL]
        assert small.engine.info.context_length == SMALL_CONTEXT
        await pool.close()

    run(scenario)


def test_a_model_in_use_is_never_evicted(needs: dict[str, int], engines: Engines) -> None:

    async def scenario() -> None:
        pool = fake_pool(pool_settings(needs))
        await use(pool, SMOLLM)
        await use(pool, GEMMA)  # SmolLM is idle and least recently used; Gemma is next
        async with Held(pool, GEMMA):
            with pytest.raises(Overloaded) as caught:
                await use(pool, SMALL)  # fails once --load-wait (0.5 s) has passed
            # Nothing was evicted in vain: evicting SmolLM alone would not have made room.
            assert list(pool.stats.recent_evictions) == []
            assert loaded(pool) == {SMOLLM, GEMMA}
        assert GEMMA in caught.value.message
        assert "Retry later" in caught.value.message
        await use(pool, SMALL)  # with Gemma idle again both go, least recently used first
        assert list(pool.stats.recent_evictions) == [SMOLLM, GEMMA]
        assert all(engine.closed for engine in engines.of(SMOLLM) + engines.of(GEMMA))
        await pool.close()

    run(scenario)


def test_a_load_that_fits_goes_ahead_while_another_waits_for_a_busy_model(
    needs: dict[str, int], engines: Engines
) -> None:
    # Room for SmolLM, Gemma and TINY; gemma-small fits only once busy Gemma goes.
    budget = needs[SMOLLM] + needs[GEMMA] + needs[TINY] + MiB
    assert budget - needs[GEMMA] < needs[SMALL]

    async def scenario() -> None:
        pool = fake_pool(pool_settings(needs, memory_budget=budget, load_wait=60))
        await use(pool, SMOLLM)
        await use(pool, GEMMA)
        held = await Held(pool, GEMMA).__aenter__()
        waiting = asyncio.create_task(use(pool, SMALL))
        assert await eventually(lambda: pool.waiting_for_memory() == [SMALL])
        await use(pool, TINY)  # loaded and served meanwhile
        assert pool.waiting_for_memory() == [SMALL]
        assert not waiting.done()
        await held.release()
        await waiting
        assert list(pool.stats.recent_evictions) == [SMOLLM, GEMMA]  # least recently used first
        assert loaded(pool) == {TINY, SMALL}
        assert (pool.loading(), pool.used_bytes()) == ([], needs[TINY] + needs[SMALL])
        await pool.close()

    run(scenario)


def test_loads_of_different_models_run_side_by_side(
    needs: dict[str, int], engines: Engines
) -> None:

    async def scenario() -> None:
        pool = fake_pool(pool_settings(needs, memory_budget=10 * needs[GEMMA]))
        engines.hold(GEMMA)
        gemma = asyncio.create_task(use(pool, GEMMA))
        assert await eventually(lambda: pool.loading() == [GEMMA])
        await use(pool, SMOLLM)  # not behind Gemma's load
        assert pool.loading() == [GEMMA]
        # Gemma's load reserved its estimate before it started: it counts as used.
        assert pool.used_bytes() == needs[GEMMA] + needs[SMOLLM]
        engines.release(GEMMA)
        await gemma
        assert loaded(pool) == {SMOLLM, GEMMA}
        await pool.close()

    run(scenario)


def test_a_failed_load_fails_its_waiters_and_the_next_request_retries(
    needs: dict[str, int], engines: Engines, tmp_path: Path
) -> None:
    late = tmp_path / "late.gguf"  # configured, but not there yet

    async def scenario() -> None:
        models = pool_settings(needs).models | {"late": ModelConfig(source=str(late))}
        pool = fake_pool(pool_settings(needs, models=models))
        calls = [use(pool, "late") for _ in range(3)]
        errors = await asyncio.gather(*calls, return_exceptions=True)
        assert all(isinstance(error, ModelNotFound) for error in errors), errors
        assert pool.loading() == []
        os.symlink(EMBEDDED_MODELS[SMOLLM].locate(), late)
        await use(pool, "late")
        assert pool.stats.loads["late"] == 1
        assert loaded(pool) == {"late"}
        await pool.close()

    run(scenario)


def test_concurrent_requests_for_an_unloaded_model_load_it_once(
    needs: dict[str, int], engines: Engines
) -> None:

    async def scenario() -> None:
        pool = fake_pool(pool_settings(needs))
        engines.hold(SMALL)  # so that all four ask while the load is in progress
        users = [asyncio.create_task(use(pool, SMALL)) for _ in range(4)]
        assert await eventually(lambda: pool.loading() == [SMALL])
        engines.release(SMALL)
        await asyncio.gather(*users)
        assert pool.stats.loads[SMALL] == 1
        assert len(engines.of(SMALL)) == 1
        await pool.close()

    run(scenario)


def test_a_model_too_big_for_the_budget_is_refused_up_front(
    needs: dict[str, int], engines: Engines
) -> None:

    async def scenario() -> None:
        pool = fake_pool(pool_settings(needs, memory_budget=needs[SMOLLM] + 1))
        plan = pool.plan(needs[GEMMA], GEMMA)
        assert not plan.fits_at_all
        with pytest.raises(NotSupported) as caught:
            await use(pool, GEMMA)
        assert "--memory-budget" in caught.value.message
        assert "more than the whole memory budget" in caught.value.message
        assert engines.of(GEMMA) == []  # refused before any engine started
        await use(pool, SMOLLM)
        await pool.close()

    run(scenario)


def test_max_loaded_models_evicts_down_to_the_limit(
    needs: dict[str, int], engines: Engines
) -> None:

    async def scenario() -> None:
        pool = fake_pool(pool_settings(needs, max_loaded_models=1))
        await use(pool, SMOLLM)
        await use(pool, GEMMA)
        assert loaded(pool) == {GEMMA}
        assert list(pool.stats.recent_evictions) == [SMOLLM]
        await pool.close()

    run(scenario)


def test_a_model_loaded_for_waiting_requests_is_theirs_before_another_load_evicts_it(
    needs: dict[str, int], engines: Engines
) -> None:
    # One model at a time, and a request for each of two models, both loading: when the
    # first load ends, the second wakes to look for room before the first's request
    # takes its model up. It used to evict it, that request to load it again, and so
    # on for ever (seen: a hang of the mixed-load test under two pytest workers).
    async def scenario() -> None:
        pool = fake_pool(pool_settings(needs, max_loaded_models=1, load_wait=60))
        engines.hold(SMOLLM)
        first = asyncio.create_task(use(pool, SMOLLM))
        assert await eventually(lambda: pool.loading() == [SMOLLM])
        second = asyncio.create_task(use(pool, GEMMA))
        assert await eventually(lambda: pool.waiting_for_memory() == [GEMMA])
        engines.release(SMOLLM)
        await asyncio.wait_for(asyncio.gather(first, second), 30)
        assert [engine.name for engine in engines.started] == [SMOLLM, GEMMA]
        assert list(pool.stats.recent_evictions) == [SMOLLM]
        await pool.close()

    run(scenario)


def test_idle_models_are_unloaded_after_the_keep_alive_but_not_the_default(
    needs: dict[str, int], engines: Engines
) -> None:

    async def scenario() -> None:
        pool = fake_pool(pool_settings(needs, keep_alive=0.3))
        pool.start_housekeeping()
        await use(pool, SMOLLM)
        await use(pool, GEMMA)
        assert pool.stats.loads[GEMMA] == 1  # it may already be gone again: no race here
        assert await eventually(lambda: GEMMA not in loaded(pool))
        assert list(pool.stats.recent_evictions) == [GEMMA]
        assert await eventually(lambda: engines.of(GEMMA)[0].closed is not None)  # out, then closed
        # The default model was idle as long, and stays.
        assert loaded(pool) == {SMOLLM}
        await pool.close()

    run(scenario)


def test_the_keep_alive_never_unloads_a_model_in_use(
    needs: dict[str, int], engines: Engines
) -> None:

    async def scenario() -> None:
        pool = fake_pool(pool_settings(needs, keep_alive=3600))
        await use(pool, SMOLLM)
        await use(pool, GEMMA)
        (gemma,) = [m for m in pool.loaded() if m.name == GEMMA]
        held = await Held(pool, GEMMA).__aenter__()
        gemma.last_used = 0.0  # idle "since 1970", but a request holds it
        assert await pool.unload_idle() == []
        await held.release()  # the release counts as a use: idle from now on
        gemma.last_used = 0.0
        assert await pool.unload_idle() == [GEMMA]
        assert loaded(pool) == {SMOLLM}
        await pool.close()

    run(scenario)


def test_an_engine_s_failure_discards_its_model_and_the_next_request_loads_afresh(
    needs: dict[str, int], engines: Engines
) -> None:

    async def scenario() -> None:
        pool = fake_pool(pool_settings(needs))
        async with Held(pool, SMOLLM):
            (broken,) = pool.loaded()
            engines.of(SMOLLM)[0].hooks.on_failure("llama_decode returned -3")
            assert broken.broken
            assert loaded(pool) == set()  # out of the pool at once
            assert engines.of(SMOLLM)[0].closed is None  # closed once its request ends
            assert pool.used_bytes() == needs[SMOLLM]  # and counted until then
        assert engines.of(SMOLLM)[0].closed
        await use(pool, SMOLLM)
        assert pool.stats.loads[SMOLLM] == 2
        (fresh,) = pool.loaded()
        assert fresh is not broken
        await pool.close()

    run(scenario)


def test_closing_the_pool_closes_every_engine_and_cancels_loads(
    needs: dict[str, int], engines: Engines
) -> None:

    async def scenario() -> None:
        pool = fake_pool(pool_settings(needs))
        await use(pool, SMOLLM)
        engines.hold(GEMMA)
        loading = asyncio.create_task(use(pool, GEMMA))
        assert await eventually(lambda: pool.loading() == [GEMMA])
        await pool.close()
        with pytest.raises(asyncio.CancelledError):
            await loading
        assert [engine.closed for engine in engines.started] == [f"model {SMOLLM!r} unloaded"]

    run(scenario)


# --- end to end: real engines, a real backend ----------------------------------------------


def generate(stub: pb_grpc.InferenceStub, model: str, max_tokens: int = 2) -> pb.GenerationFinished:
    request = pb.GenerateRequest(model=model, prompt="Hello", max_tokens=max_tokens, temperature=0)
    return finished_of(collect(stub.Generate(request)))


def loaded_over_rpc(stub: pb_grpc.InferenceStub) -> dict[str, pb.ModelInfo]:
    return {m.name: m for m in stub.ListModels(pb.ListModelsRequest()).models if m.loaded}


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def test_end_to_end_admit_names_what_a_load_evicts_and_its_engine_stops(
    needs: dict[str, int],
) -> None:
    gemma_path = str(EMBEDDED_MODELS[GEMMA].locate())
    huge = ModelConfig(source=gemma_path, context_size=32768)  # more than the whole budget
    settings = pool_settings(needs)
    settings = pool_settings(needs, models=settings.models | {"gemma-huge": huge})
    with serving(settings) as (running, stub):
        generate(stub, GEMMA)
        generate(stub, SMOLLM)  # now Gemma is the least recently used
        gemma_pid = loaded_over_rpc(stub)[GEMMA].engine_pid
        admit = stub.Admit(pb.AdmitRequest(model=SMALL))
        assert admit.admitted
        assert list(admit.memory.would_evict) == [GEMMA]
        generate(stub, SMALL)
        assert set(loaded_over_rpc(stub)) == {SMOLLM, SMALL}
        assert list(running.server.pool.stats.recent_evictions) == [GEMMA]
        assert not alive(gemma_pid)  # the evicted model's engine process is gone
        info = loaded_over_rpc(stub)[SMALL]
        assert info.memory_bytes == admit.memory.host_bytes == admit.memory.total_bytes
        assert info.context_length == SMALL_CONTEXT
        assert info.last_used_unix_ms > 0
        # Too big for the whole budget: refused up front, over both RPCs.
        refused = stub.Admit(pb.AdmitRequest(model="gemma-huge"))
        assert not refused.admitted
        assert not refused.memory.fits
        assert "memory budget" in refused.reason
        with pytest.raises(grpc.RpcError) as caught:
            generate(stub, "gemma-huge")
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION  # not worth a retry
        assert "--memory-budget" in (caught.value.details() or "")
        assert set(loaded_over_rpc(stub)) == {SMOLLM, SMALL}  # nothing evicted for it


@pytest.fixture(scope="module")
def in_process() -> Iterator[tuple[RunningServer, pb_grpc.InferenceStub]]:
    with serving(make_settings(engine_mode="in-process")) as server_and_stub:
        yield server_and_stub


def test_in_process_tokenize_detokenize_and_embed_answer_as_an_engine_process_does(
    in_process: tuple[RunningServer, pb_grpc.InferenceStub],
) -> None:
    _, stub = in_process
    text = "The sea was calm that morning."
    tokens = stub.Tokenize(pb.TokenizeRequest(model=SMOLLM, prompt=text))
    assert len(tokens.token_ids) > 3
    back = stub.Detokenize(pb.DetokenizeRequest(model=SMOLLM, token_ids=tokens.token_ids))
    assert back.text == text
    inputs = [pb.EmbedInput(text=text), pb.EmbedInput(text="A storm came at night.")]
    embedded = stub.Embed(pb.EmbedRequest(inputs=inputs))
    assert len(embedded.embeddings) == 2
    for vector in embedded.embeddings:
        assert len(vector.values) == 384  # all-MiniLM-L6-v2
        assert abs(sum(v * v for v in vector.values) - 1) < 1e-3  # unit length


def test_a_backend_that_fails_mid_forward_is_discarded_and_reloaded(
    in_process: tuple[RunningServer, pb_grpc.InferenceStub], monkeypatch: pytest.MonkeyPatch
) -> None:
    # In process, so that the test can make llama.cpp's step fail as a crashed
    # forward pass would; an engine process runs the same code.
    running, stub = in_process
    pool = running.server.pool
    generate(stub, SMOLLM)
    loads = pool.stats.loads[SMOLLM]
    (broken,) = [m for m in pool.loaded() if m.name == SMOLLM]
    backend = cast(LocalEngine, broken.engine).core.backend
    assert isinstance(backend, LlamaCppBackend)
    monkeypatch.setattr(backend, "step", failing_after(backend.step, tokens=2))
    with pytest.raises(grpc.RpcError) as caught:
        generate(stub, SMOLLM, max_tokens=10)
    assert caught.value.code() == grpc.StatusCode.INTERNAL
    assert "failed while generating" in (caught.value.details() or "")
    assert "loads it afresh" in (caught.value.details() or "")
    assert broken.broken
    assert generate(stub, SMOLLM).usage.completion_tokens == 2
    assert pool.stats.loads[SMOLLM] == loads + 1
    (fresh,) = [m for m in pool.loaded() if m.name == SMOLLM]
    assert fresh is not broken


def failing_after(step: Callable[..., list[Any]], tokens: int) -> Callable[..., list[Any]]:
    """`step`, raising as llama.cpp's forward pass would once `tokens` were sampled."""
    sampled = 0

    def failing(*args: Any) -> list[Any]:
        nonlocal sampled
        if sampled >= tokens:
            raise RuntimeError("llama_decode returned -3")
        result = step(*args)
        sampled += sum(1 for entry in result if entry is not None)
        return result

    return failing


class ErrorLog:
    """Stands in for the RPC layer's logger: keeps what each `exception` call was handling."""

    def __init__(self) -> None:
        self.handling: list[BaseException | None] = []

    def exception(self, event: str, **fields: object) -> None:
        self.handling.append(sys.exc_info()[1])

    def info(self, event: str, **fields: object) -> None:
        pass

    def warning(self, event: str, **fields: object) -> None:
        pass


@pytest.mark.parametrize(
    "target",
    [
        (core, "fit_max_tokens"),  # preparing, on the worker
        (SequenceDecoder, "push"),  # decoding, inside a scheduler step
    ],
    ids=["preparing", "decoding"],
)
def test_a_bug_of_ours_is_internal_and_leaves_the_model_loaded(
    in_process: tuple[RunningServer, pb_grpc.InferenceStub],
    monkeypatch: pytest.MonkeyPatch,
    target: tuple[Any, str],
) -> None:
    # In process, so that the test can plant the bug; an engine process runs the
    # same code, and sends the error back for the front to answer (see wire.py).
    running, stub = in_process
    pool = running.server.pool
    generate(stub, SMOLLM)
    (model,) = [m for m in pool.loaded() if m.name == SMOLLM]
    loads = pool.stats.loads[SMOLLM]
    errors = ErrorLog()

    def bug(*args: object, **kwargs: object) -> Any:
        raise TypeError("a bug of ours")

    with monkeypatch.context() as patched:
        patched.setattr(*target, bug)
        patched.setattr(rpc, "log", errors)
        with pytest.raises(grpc.RpcError) as caught:
            generate(stub, SMOLLM)
    assert caught.value.code() == grpc.StatusCode.INTERNAL
    assert caught.value.details() == INTERNAL_MESSAGE
    # Logged with its traceback: `exception` logs the one being handled.
    assert [repr(error) for error in errors.handling] == [repr(TypeError("a bug of ours"))]
    assert not model.broken
    assert generate(stub, SMOLLM).usage.completion_tokens == 2
    assert [m for m in pool.loaded() if m.name == SMOLLM] == [model]
    assert pool.stats.loads[SMOLLM] == loads
