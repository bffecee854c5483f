"""The pool of loaded models: LRU under a memory budget, loads side by side, broken backends.

A model is made busy by holding it through `pool.use` on the server's loop (`Held`): for
the pool that is a request in progress, and unlike a real stream it ends only when the
test says so, however fast the machine decodes.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import grpc
import pytest

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from service.admission import Capability, decide
from service.backends.llama_cpp import LlamaCppBackend
from service.config import ModelConfig, Settings
from service.decode.sequence import SequenceDecoder
from service.engine import core
from service.engine.local import LocalEngine
from service.errors import INTERNAL_MESSAGE
from service.front import rpc
from service.model_source import ModelSource
from service.models.embedded import EMBEDDED_MODELS
from service.models.pool import ModelPool
from tests.conftest import (
    GEMMA,
    SMOLLM,
    RunningServer,
    collect,
    eventually,
    finished_of,
    make_settings,
    serving,
)

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
    settings: dict[str, Any] = {
        "context_size": CONTEXT,
        # Both embedded models fit; a third does not, and evicting SmolLM alone
        # (smaller than gemma-small) would not make room for gemma-small either.
        "memory_budget": needs[SMOLLM] + needs[GEMMA] + (needs[SMALL] - needs[SMOLLM]) // 2,
        "models": {SMALL: ModelConfig(source=gemma_path, context_size=SMALL_CONTEXT)},
        "load_wait": 0.5,
    }
    settings.update(overrides)
    return make_settings(**settings)


@pytest.fixture
def budget(needs: dict[str, int]) -> Iterator[tuple[RunningServer, pb_grpc.InferenceStub]]:
    with serving(pool_settings(needs)) as server_and_stub:
        yield server_and_stub


@pytest.fixture
def budget_server(budget: tuple[RunningServer, pb_grpc.InferenceStub]) -> RunningServer:
    return budget[0]


@pytest.fixture
def stub(budget: tuple[RunningServer, pb_grpc.InferenceStub]) -> pb_grpc.InferenceStub:
    return budget[1]


def generate(stub: pb_grpc.InferenceStub, model: str, max_tokens: int = 2) -> pb.GenerationFinished:
    request = pb.GenerateRequest(model=model, prompt="Hello", max_tokens=max_tokens, temperature=0)
    return finished_of(collect(stub.Generate(request)))


def loaded(stub: pb_grpc.InferenceStub) -> dict[str, pb.ModelInfo]:
    return {m.name: m for m in stub.ListModels(pb.ListModelsRequest()).models if m.loaded}


class Held:
    """A request in progress on `model` as the pool sees it, until `release()`."""

    def __init__(self, running: RunningServer, model: str) -> None:
        self._running = running
        self._release, self._task = running.run(self._hold(running.server.pool, model))

    @staticmethod
    async def _hold(pool: ModelPool, model: str) -> tuple[asyncio.Event, asyncio.Task[None]]:
        holding, release = asyncio.Event(), asyncio.Event()

        async def user() -> None:
            async with pool.use(model):
                holding.set()
                await release.wait()

        task = asyncio.create_task(user())
        await holding.wait()
        return release, task

    def release(self) -> None:
        async def end() -> None:
            self._release.set()
            await self._task

        self._running.run(end())


def test_least_recently_used_idle_model_is_evicted(
    budget_server: RunningServer, stub: pb_grpc.InferenceStub
) -> None:
    generate(stub, GEMMA)
    generate(stub, SMOLLM)  # now Gemma is the least recently used
    assert set(loaded(stub)) == {SMOLLM, GEMMA}
    admit = stub.Admit(pb.AdmitRequest(model=SMALL))
    assert admit.admitted
    assert list(admit.memory.would_evict) == [GEMMA]
    generate(stub, SMALL)
    assert set(loaded(stub)) == {SMOLLM, SMALL}
    assert list(budget_server.server.pool.stats.recent_evictions) == [GEMMA]
    info = loaded(stub)[SMALL]
    assert info.memory_bytes == admit.memory.host_bytes == admit.memory.total_bytes
    assert info.context_length == SMALL_CONTEXT
    assert info.last_used_unix_ms > 0


def test_a_model_in_use_is_never_evicted(
    budget_server: RunningServer, stub: pb_grpc.InferenceStub
) -> None:
    generate(stub, SMOLLM)
    generate(stub, GEMMA)  # SmolLM is idle and least recently used; Gemma is next
    held = Held(budget_server, GEMMA)
    with pytest.raises(grpc.RpcError) as caught:
        generate(stub, SMALL)  # fails once --load-wait (0.5 s) has passed
    held.release()
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert GEMMA in (caught.value.details() or "")
    # Nothing was evicted in vain: evicting SmolLM alone would not have made room.
    assert list(budget_server.server.pool.stats.recent_evictions) == []
    assert set(loaded(stub)) == {SMOLLM, GEMMA}
    generate(stub, SMALL)  # with Gemma idle again both go, least recently used first
    assert list(budget_server.server.pool.stats.recent_evictions) == [SMOLLM, GEMMA]


def test_a_load_that_fits_goes_ahead_while_another_waits_for_a_busy_model(
    needs: dict[str, int],
) -> None:
    # Room for SmolLM, Gemma and TINY; gemma-small fits only once busy Gemma goes.
    budget = needs[SMOLLM] + needs[GEMMA] + needs[TINY] + MiB
    assert budget - needs[GEMMA] < needs[SMALL]
    small = str(EMBEDDED_MODELS[SMOLLM].locate())
    models = pool_settings(needs).models | {
        TINY: ModelConfig(source=small, context_size=SMALL_CONTEXT)
    }
    settings = pool_settings(needs, memory_budget=budget, models=models, load_wait=60)
    with serving(settings) as (running, stub), ThreadPoolExecutor(1) as client:
        pool = running.server.pool
        generate(stub, GEMMA)
        held = Held(running, GEMMA)
        waiting: Future[pb.GenerationFinished] = client.submit(generate, stub, SMALL)
        assert eventually(lambda: pool.waiting_for_memory() == [SMALL])
        assert generate(stub, TINY).usage.completion_tokens == 2  # loaded and served meanwhile
        assert pool.waiting_for_memory() == [SMALL]
        assert not waiting.done()
        held.release()
        assert waiting.result(timeout=120).usage.completion_tokens == 2
        assert list(pool.stats.recent_evictions) == [SMOLLM, GEMMA]  # least recently used first
        assert set(loaded(stub)) == {TINY, SMALL}
        assert (pool.loading(), pool.used_bytes()) == ([], needs[TINY] + needs[SMALL])


def test_a_failed_load_fails_its_waiters_and_the_next_request_retries(
    needs: dict[str, int], tmp_path: Path
) -> None:
    late = tmp_path / "late.gguf"  # configured, but not there yet
    models = pool_settings(needs).models | {"late": ModelConfig(source=str(late))}
    with serving(pool_settings(needs, models=models)) as (running, stub):
        with ThreadPoolExecutor(3) as clients:
            calls = [clients.submit(generate, stub, "late") for _ in range(3)]
            errors = [call.exception(timeout=120) for call in calls]
        assert all(isinstance(error, grpc.RpcError) for error in errors)
        codes = {error.code() for error in errors if isinstance(error, grpc.RpcError)}
        assert codes == {grpc.StatusCode.NOT_FOUND}
        assert running.server.pool.loading() == []
        os.symlink(EMBEDDED_MODELS[SMOLLM].locate(), late)
        assert generate(stub, "late").usage.completion_tokens == 2
        assert running.server.pool.stats.loads["late"] == 1


def test_concurrent_requests_for_an_unloaded_model_load_it_once(
    budget_server: RunningServer, stub: pb_grpc.InferenceStub
) -> None:
    results: list[pb.GenerationFinished] = []
    threads = [
        threading.Thread(target=lambda: results.append(generate(stub, SMALL))) for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 4
    assert budget_server.server.pool.stats.loads[SMALL] == 1


def test_a_model_too_big_for_the_budget_is_refused_up_front(
    needs: dict[str, int],
) -> None:
    with serving(pool_settings(needs, memory_budget=needs[SMOLLM] + 1)) as (_, stub):
        reply = stub.Admit(pb.AdmitRequest(model=GEMMA))
        assert not reply.admitted
        assert not reply.memory.fits
        assert "memory budget" in reply.reason
        with pytest.raises(grpc.RpcError) as caught:
            generate(stub, GEMMA)
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "--memory-budget" in (caught.value.details() or "")
        assert generate(stub, SMOLLM).usage.completion_tokens == 2


def test_max_loaded_models_evicts_down_to_the_limit(needs: dict[str, int]) -> None:
    with serving(pool_settings(needs, max_loaded_models=1)) as (_, stub):
        generate(stub, GEMMA)
        assert set(loaded(stub)) == {GEMMA}


def test_idle_models_are_unloaded_after_the_keep_alive_but_not_the_default(
    needs: dict[str, int],
) -> None:
    with serving(pool_settings(needs, keep_alive=0.3)) as (running, stub):
        pool = running.server.pool
        generate(stub, GEMMA)
        assert pool.stats.loads[GEMMA] == 1  # it may already be gone again: no race here
        assert eventually(lambda: GEMMA not in loaded(stub))
        assert list(pool.stats.recent_evictions) == [GEMMA]
        # The default model was idle as long, and stays.
        assert set(loaded(stub)) == {SMOLLM}


def test_the_keep_alive_never_unloads_a_model_in_use(needs: dict[str, int]) -> None:
    with serving(pool_settings(needs, keep_alive=3600)) as (running, stub):
        pool = running.server.pool
        generate(stub, GEMMA)
        (gemma,) = [m for m in pool.loaded() if m.name == GEMMA]
        held = Held(running, GEMMA)
        gemma.last_used = 0.0  # idle "since 1970", but a request holds it
        assert running.run(pool.unload_idle()) == []
        held.release()  # the release counts as a use: idle from now on
        gemma.last_used = 0.0
        assert running.run(pool.unload_idle()) == [GEMMA]
        assert set(loaded(stub)) == {SMOLLM}


def test_a_backend_that_fails_mid_forward_is_discarded_and_reloaded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # In process, so that the test can make llama.cpp's step fail as a crashed
    # forward pass would; an engine process runs the same code.
    with serving(make_settings(engine_mode="in-process")) as (running, stub):
        pool = running.server.pool
        generate(stub, SMOLLM)
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
        assert pool.stats.loads[SMOLLM] == 2
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
    assert pool.stats.loads[SMOLLM] == 1


@pytest.fixture(scope="module")
def in_process() -> Iterator[tuple[RunningServer, pb_grpc.InferenceStub]]:
    with serving(make_settings(engine_mode="in-process")) as server_and_stub:
        yield server_and_stub
