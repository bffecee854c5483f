"""Host and GPU memory apart: the split of a model by offloaded layers, and the pool's budgets.

A CPU-only llama.cpp offloads nothing, so these tests give the decision the
CUDA build's answer themselves; the arithmetic is the same on either build.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, cast

import gguf
import pytest

from service.admission import Capability, Decision, decide, gates
from service.admission.describe import describe_gguf
from service.backends.names import kv_layout_on
from service.engine.model_options import ModelOptions
from service.memory import MemoryNeed, offloaded_share
from service.model_source import ModelSource
from service.models.admit_report import AdmissionReport
from service.models.catalog import ModelSpec
from service.models.pool import LoadedModel, ModelPool, PoolLimits, memory_need
from tests.fixtures import Q, write_gguf_header

GiB = 1024**3


@pytest.mark.parametrize(
    ("gpu_layers", "layers", "share"),
    [(-1, 16, 1.0), (0, 16, 0.0), (4, 16, 0.25), (16, 16, 1.0), (99, 16, 1.0), (8, 0, 0.0)],
)
def test_the_offloaded_share_follows_llama_cpps_layer_count(
    gpu_layers: int, layers: int, share: float
) -> None:
    assert offloaded_share(gpu_layers, layers) == share


@pytest.fixture(scope="module")
def four_layer_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "llama-q8.gguf"
    return write_gguf_header(path, "llama", gguf.LlamaFileType.MOSTLY_Q8_0, [Q.Q8_0], layers=4)


def test_offloaded_layers_move_their_share_of_weights_and_kv_cache_to_the_gpu(
    four_layer_gguf: Path,
) -> None:
    cuda = Decision(True, "", "llama.cpp", describe_gguf(four_layer_gguf), True, offloads=True)
    weights, kv_cache = cuda.memory(1024).weights_bytes, cuda.memory(1024).kv_cache_bytes
    assert kv_cache == 4 * 2 * 128 * 2 * 1024
    half = cuda.memory(1024, gpu_layers=2)
    assert half.device_bytes == round((weights + kv_cache) / 2)
    assert half.host_bytes + half.device_bytes == half.total_bytes == weights + kv_cache
    assert cuda.memory(1024, gpu_layers=-1).host_bytes == 0
    assert cuda.memory(1024, gpu_layers=0).device_bytes == 0
    cpu_only = dataclasses.replace(cuda, offloads=False)
    assert cpu_only.memory(1024, gpu_layers=-1) == MemoryNeed(weights, kv_cache, 0)


def spec(name: str = "m", *, context_size: int = 1, **options: Any) -> ModelSpec:
    """A model's spec with these options (one thread; the rest as the settings default)."""
    model = ModelOptions(context_size=context_size, threads=1, **options)
    return ModelSpec(name, "", cast(Any, None), model)


def test_conversations_are_parked_in_host_memory_only_on_the_cpu(four_layer_gguf: Path) -> None:
    cuda = Decision(True, "", "llama.cpp", describe_gguf(four_layer_gguf), True, offloads=True)
    on_the_cpu = memory_need(cuda, spec(context_size=1024, cached_sequences=4, gpu_layers=0))
    assert on_the_cpu.parked_bytes == on_the_cpu.kv_cache_bytes
    on_the_gpu = spec(context_size=1024, cached_sequences=4, gpu_layers=-1)
    assert memory_need(cuda, on_the_gpu).parked_bytes == 0


def test_a_per_sequence_layout_counts_a_cache_for_every_sequence(four_layer_gguf: Path) -> None:
    cuda = Decision(True, "", "llama.cpp", describe_gguf(four_layer_gguf), True, offloads=True)
    per_sequence = memory_need(
        cuda, spec(context_size=1000, gpu_layers=0, kv_layout="per-sequence")
    )
    # 8 running + 4 cached sequences, each with 1000 cells rounded up to 1024.
    assert per_sequence.kv_cache_bytes == 12 * cuda.memory(1024).kv_cache_bytes
    assert per_sequence.parked_bytes == 0


def test_the_automatic_layout_is_a_cache_per_sequence_only_on_a_gpu(
    four_layer_gguf: Path,
) -> None:
    cuda = Decision(True, "", "llama.cpp", describe_gguf(four_layer_gguf), True, offloads=True)
    on_the_gpu = memory_need(cuda, spec(context_size=1024, gpu_layers=-1))
    assert on_the_gpu.kv_cache_bytes == 12 * cuda.memory(1024).kv_cache_bytes
    on_the_cpu = memory_need(cuda, spec(context_size=1024, gpu_layers=0))
    assert on_the_cpu.kv_cache_bytes == cuda.memory(1024).kv_cache_bytes
    assert kv_layout_on("auto", on_gpu=True) == "per-sequence"
    assert kv_layout_on("auto", on_gpu=False) == "unified"
    assert kv_layout_on("unified", on_gpu=True) == "unified"
    assert kv_layout_on("per-sequence", on_gpu=False) == "per-sequence"


def test_a_gpus_compute_buffer_is_a_logits_row_per_step_token(
    four_layer_gguf: Path,
) -> None:
    """On a GPU llama.cpp reserves a logits row for every token a step may hold (1,024
    unless --batch-size says otherwise), in GPU memory, at load. On the CPU the buffer's
    pages are touched only as far as a step reaches, so it is not counted there."""
    cuda = Decision(True, "", "llama.cpp", describe_gguf(four_layer_gguf), True, offloads=True)
    assert describe_gguf(four_layer_gguf).vocab_size == 64
    on_the_gpu = memory_need(cuda, spec(context_size=1024, gpu_layers=-1))
    assert on_the_gpu.compute_bytes == 4 * 64 * 1024
    assert on_the_gpu.host_bytes == 0
    assert on_the_gpu.device_bytes == on_the_gpu.total_bytes
    assert on_the_gpu.total_bytes == sum(
        (on_the_gpu.weights_bytes, on_the_gpu.kv_cache_bytes, on_the_gpu.compute_bytes)
    )
    configured = memory_need(cuda, spec(context_size=1024, gpu_layers=-1, batch_size=256))
    assert configured.compute_bytes == 4 * 64 * 256
    assert memory_need(cuda, spec(context_size=1024, gpu_layers=0)).compute_bytes == 0
    half = memory_need(cuda, spec(context_size=1024, gpu_layers=2))
    assert half.compute_bytes == 0
    assert half.device_bytes == round((half.weights_bytes + half.kv_cache_bytes) / 2)


def test_admission_asks_the_build_whether_it_offloads(four_layer_gguf: Path) -> None:
    decision = decide(ModelSource("gguf", four_layer_gguf), Capability.TEXT, offline=True)
    assert decision.admitted, decision.reason
    assert decision.offloads == gates.llama_cpp_offloads()


def pool_with(limits: PoolLimits, *models: tuple[str, int, int, int]) -> ModelPool:
    """A pool holding (name, host bytes, GPU bytes, active requests) models, oldest first."""
    pool = ModelPool(cast(Any, None), cast(Any, None), cast(Any, None), limits)
    for name, host, device, active in models:
        model = LoadedModel(spec(name), cast(Any, None), host, Capability.TEXT, device)
        model.active_requests = active
        pool._loaded[name] = model
    return pool


def test_gpu_memory_alone_can_force_an_eviction() -> None:
    pool = pool_with(PoolLimits(100 * GiB, device_budget_bytes=10 * GiB), ("a", GiB, 6 * GiB, 0))
    plan = pool.plan(GiB, "b", device_need=6 * GiB)
    assert plan.fits_at_all
    assert plan.evict == ("a",)
    assert pool.plan(GiB, "b", device_need=4 * GiB).evict == ()
    assert pool.used_device_bytes() == 6 * GiB


def test_a_busy_model_on_the_gpu_blocks_a_load_that_needs_its_gpu_memory() -> None:
    pool = pool_with(PoolLimits(100 * GiB, device_budget_bytes=10 * GiB), ("a", GiB, 6 * GiB, 1))
    plan = pool.plan(GiB, "b", device_need=6 * GiB)
    assert plan.fits_at_all
    assert plan.blocked_by_busy


def test_without_a_gpu_budget_gpu_memory_is_not_limited() -> None:
    pool = pool_with(PoolLimits(10 * GiB), ("a", GiB, 600 * GiB, 0))
    plan = pool.plan(GiB, "b", device_need=600 * GiB)
    assert (plan.fits_at_all, plan.evict, plan.blocked_by_busy) == (True, (), False)


def test_admit_reports_host_and_gpu_bytes_and_names_the_gpu_budget_it_exceeds(
    four_layer_gguf: Path,
) -> None:
    decision = Decision(True, "ok", "llama.cpp", describe_gguf(four_layer_gguf), True, True)
    need = decision.memory(1024, gpu_layers=2)
    limits = PoolLimits(100 * GiB, device_budget_bytes=need.device_bytes - 1)
    pool = pool_with(limits)
    plan = pool.plan(need.host_bytes, "m", need.device_bytes)
    report = AdmissionReport(decision, need, plan, limits, 0, 0, loaded=False)
    reply = report.to_pb()
    assert not reply.admitted
    assert "--gpu-memory-budget" in reply.reason
    memory = reply.memory
    assert (memory.host_bytes, memory.device_bytes) == (need.host_bytes, need.device_bytes)
    assert memory.host_bytes + memory.device_bytes == memory.total_bytes
    assert memory.device_budget_bytes == need.device_bytes - 1
    unlimited = dataclasses.replace(report, limits=PoolLimits(100 * GiB))
    assert not unlimited.to_pb().memory.HasField("device_budget_bytes")


def test_a_unified_pool_may_exceed_the_trained_window_and_one_sequence_may_not(
    four_layer_gguf: Path,
) -> None:
    # The fixture's model was trained for 2048 tokens.
    cuda = Decision(True, "", "llama.cpp", describe_gguf(four_layer_gguf), True, offloads=True)
    per_token = cuda.memory(1).kv_cache_bytes
    unified = spec(context_size=8192, gpu_layers=-1, kv_layout="unified")
    assert memory_need(cuda, unified).kv_cache_bytes == 8192 * per_token
    assert cuda.memory(8192).kv_cache_bytes == 2048 * per_token
    per_sequence = memory_need(
        cuda, spec(context_size=8192, gpu_layers=-1, kv_layout="per-sequence")
    )
    assert per_sequence.kv_cache_bytes == 12 * 2048 * per_token
