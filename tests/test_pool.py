"""The pool of loaded models: LRU under a memory budget, single loads, broken backends."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from service.admission import Capability, decide
from service.backends.llama_cpp import LlamaCppBackend
from service.config import ModelConfig, Settings
from service.models.embedded import EMBEDDED_MODELS
from service.models.sources import ModelSource
from tests.conftest import (
    GEMMA,
    SMOLLM,
    RunningServer,
    collect,
    finished_of,
    make_settings,
    serving,
)

SMALL = "gemma-small"  # the Gemma file again, under another name and context size
CONTEXT = 1024
SMALL_CONTEXT = 256


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
    assert budget_server.server.pool.stats.evictions == [GEMMA]
    info = loaded(stub)[SMALL]
    assert info.memory_bytes == admit.memory.host_bytes == admit.memory.total_bytes
    assert info.context_length == SMALL_CONTEXT
    assert info.last_used_unix_ms > 0


def test_a_model_with_a_stream_in_progress_is_never_evicted(
    budget_server: RunningServer, stub: pb_grpc.InferenceStub
) -> None:
    generate(stub, SMOLLM)
    generate(stub, GEMMA)  # SmolLM is idle and least recently used; Gemma is next
    stream = stub.Generate(
        pb.GenerateRequest(model=GEMMA, prompt="Count:", max_tokens=120, temperature=0)
    )
    next(stream)  # Gemma is now busy
    with pytest.raises(grpc.RpcError) as caught:
        generate(stub, SMALL)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert GEMMA in (caught.value.details() or "")
    events = list(stream)
    assert events[-1].finished.usage.completion_tokens == 120
    # Nothing was evicted in vain: evicting SmolLM alone would not have made room.
    assert budget_server.server.pool.stats.evictions == []
    assert set(loaded(stub)) == {SMOLLM, GEMMA}
    generate(stub, SMALL)  # with Gemma idle again both go, least recently used first
    assert budget_server.server.pool.stats.evictions == [SMOLLM, GEMMA]


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
    with serving(pool_settings(needs, keep_alive=0.3)) as (_, stub):
        generate(stub, GEMMA)
        assert GEMMA in loaded(stub)
        deadline = time.monotonic() + 10
        while GEMMA in loaded(stub) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert set(loaded(stub)) == {SMOLLM}


def test_a_backend_that_fails_mid_forward_is_discarded_and_reloaded(
    budget_server: RunningServer, stub: pb_grpc.InferenceStub
) -> None:
    pool = budget_server.server.pool
    generate(stub, SMOLLM)
    (broken,) = [m for m in pool.loaded() if m.name == SMOLLM]
    assert isinstance(broken.backend, LlamaCppBackend)
    broken.backend.inject_fault(after_tokens=2)
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
