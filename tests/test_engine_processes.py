"""Engine processes: each loaded model in a process of its own, and what a crash costs.

These kill real engine processes (SIGKILL from outside, an abort from inside
llama.cpp on a malformed file) and check that only the dead model's requests
notice, with UNAVAILABLE naming the model and the cause.
"""

from __future__ import annotations

import asyncio
import os
import signal
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from service.engine.base import EngineCrashed, EngineHooks
from service.engine.model_options import ModelOptions
from service.engine.options import EngineOptions
from service.engine.process import EngineProcess
from service.engine.serve import OOM_SCORE_ADJ_ABOVE_FRONT, prefer_to_be_killed
from service.models.embedded import EMBEDDED_MODELS
from tests import gguf_mutations as gm
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
from tests.server_process import server_process, wait_until_serving

COUNTING = "Count: 1, 2, 3, 4,"


def greedy(model: str, max_tokens: int, prompt: str = COUNTING) -> pb.GenerateRequest:
    return pb.GenerateRequest(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0)


def token_ids(events: list[pb.GenerateResponse]) -> list[int]:
    return [t for e in events if e.WhichOneof("event") == "delta" for t in e.delta.token_ids]


def engine_pids(stub: pb_grpc.InferenceStub) -> dict[str, int]:
    models = stub.ListModels(pb.ListModelsRequest()).models
    return {m.name: m.engine_pid for m in models if m.loaded}


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="module")
def two_models() -> Iterator[tuple[RunningServer, pb_grpc.InferenceStub]]:
    settings = make_settings(metrics_listen="127.0.0.1:0", engine_crash_limit=0)
    with serving(settings) as server_and_stub:
        yield server_and_stub


def test_each_loaded_model_runs_in_an_engine_process_of_its_own(
    two_models: tuple[RunningServer, pb_grpc.InferenceStub],
) -> None:
    running, stub = two_models
    collect(stub.Generate(greedy(GEMMA, 2)))
    pids = engine_pids(stub)
    assert set(pids) == {SMOLLM, GEMMA}
    assert len(set(pids.values())) == 2
    for pid in pids.values():
        assert pid not in (0, os.getpid())
        assert b"service.engine" in Path(f"/proc/{pid}/cmdline").read_bytes()
    info = {m.name: m for m in stub.ListModels(pb.ListModelsRequest()).models}
    assert info[GEMMA].rss_bytes > 0
    admit = stub.Admit(pb.AdmitRequest(model=GEMMA))
    assert admit.loaded
    assert admit.memory.measured_rss_bytes > 0
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{running.server.metrics_port}/metrics")
    text = metrics.read().decode()
    assert f'inference_engine_rss_bytes{{model="{GEMMA}"}}' in text


def test_engines_are_the_oom_killer_s_choice_before_the_front(
    two_models: tuple[RunningServer, pb_grpc.InferenceStub],
) -> None:
    _, stub = two_models
    collect(stub.Generate(greedy(GEMMA, 2)))
    front = int(Path("/proc/self/oom_score_adj").read_text())  # the front runs in this process
    for pid in engine_pids(stub).values():
        engine = int(Path(f"/proc/{pid}/oom_score_adj").read_text())
        assert engine == min(1000, front + OOM_SCORE_ADJ_ABOVE_FRONT)


@pytest.mark.parametrize(
    ("inherited", "expected"), [("0\n", "500"), ("-997", "-497"), ("900", "1000")]
)
def test_an_engine_raises_its_inherited_oom_score(
    tmp_path: Path, inherited: str, expected: str
) -> None:
    setting = tmp_path / "oom_score_adj"
    setting.write_text(inherited)
    prefer_to_be_killed(str(setting))
    assert setting.read_text().strip() == expected
    prefer_to_be_killed(str(tmp_path / "absent"))  # not Linux: nothing happens


def test_a_killed_engine_costs_only_its_own_model_requests(
    two_models: tuple[RunningServer, pb_grpc.InferenceStub],
) -> None:
    running, stub = two_models
    undisturbed = collect(stub.Generate(greedy(GEMMA, 48)))
    victim = engine_pids(stub)[SMOLLM]

    survivor = stub.Generate(greedy(GEMMA, 48))
    survivor_events = [next(survivor), next(survivor)]  # started, and decoding
    doomed = stub.Generate(greedy(SMOLLM, 400))
    next(doomed)
    next(doomed)  # decoding
    os.kill(victim, signal.SIGKILL)
    with pytest.raises(grpc.RpcError) as caught:
        list(doomed)
    # The stream ended on the engine's death, while the other model still streams.
    survivor_events.append(next(survivor))
    survivor_events += list(survivor)

    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    details = caught.value.details() or ""
    assert SMOLLM in details
    assert "SIGKILL" in details
    assert token_ids(survivor_events) == token_ids(undisturbed)
    assert finished_of(survivor_events).usage.completion_tokens == 48
    # The next request starts a fresh engine; health never left SERVING.
    assert finished_of(collect(stub.Generate(greedy(SMOLLM, 3)))).usage.completion_tokens == 3
    assert engine_pids(stub)[SMOLLM] != victim
    assert not alive(victim)
    health = health_pb2_grpc.HealthStub(grpc.insecure_channel(running.target))
    status = health.Check(health_pb2.HealthCheckRequest()).status
    assert status == health_pb2.HealthCheckResponse.SERVING
    assert SMOLLM in running.server.pool.stats.crashes


def test_a_model_that_keeps_crashing_is_refused_with_the_reason() -> None:
    # That the refusal ends with the window: tests/test_engine_exits.py, on a fake clock.
    settings = make_settings(engine_crash_limit=2, engine_crash_window=600)
    with serving(settings) as (_, stub):
        for _ in range(2):
            collect(stub.Generate(greedy(GEMMA, 2)))
            gemma = engine_pids(stub)[GEMMA]
            os.kill(gemma, signal.SIGKILL)
            assert eventually(lambda: GEMMA not in engine_pids(stub))
        with pytest.raises(grpc.RpcError) as caught:
            collect(stub.Generate(greedy(GEMMA, 2)))
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        details = caught.value.details() or ""
        assert "crashed 2 times in the last 10 minutes" in details
        assert "SIGKILL" in details
        # Another model serves on.
        assert finished_of(collect(stub.Generate(greedy(SMOLLM, 2)))).usage.completion_tokens == 2


def malformed_copy(directory: Path) -> Path:
    """SmolLM with 600 layers declared: llama.cpp aborts loading it (admission refuses
    it, so this file reaches an engine only when started directly)."""
    template = gm.Template.parse(EMBEDDED_MODELS[SMOLLM].locate())
    template.put_scalar(f"{template.architecture}.block_count", gm.U32, 600)
    return gm.write(template.encode(), directory / "600-layers.gguf")


def test_an_engine_that_aborts_loading_a_malformed_file_is_reported(tmp_path: Path) -> None:
    options = EngineOptions(
        name="broken",
        backend="llama.cpp",
        path=malformed_copy(tmp_path),
        model=ModelOptions(context_size=256, threads=1),
    )
    with pytest.raises(EngineCrashed) as caught:
        asyncio.run(EngineProcess.start(options, EngineHooks()))
    assert caught.value.code == grpc.StatusCode.UNAVAILABLE
    assert "SIGABRT" in caught.value.cause
    assert "'broken'" in caught.value.message


def test_engines_do_not_outlive_a_killed_server() -> None:
    with server_process(["--threads", "1", "--context-size", "512"]) as server:
        with grpc.insecure_channel(server.wait_for_address()) as channel:
            wait_until_serving(channel)
            stub = pb_grpc.InferenceStub(channel)
            collect(stub.Generate(greedy(GEMMA, 2)))
            pids = list(engine_pids(stub).values())
        assert len(pids) == 2
        assert all(alive(pid) for pid in pids)
        server.process.send_signal(signal.SIGKILL)
        server.process.wait(timeout=30)
        assert eventually(lambda: not any(alive(pid) for pid in pids))


def test_sigterm_drains_the_stream_then_stops_the_engines() -> None:
    with server_process(["--threads", "1", "--context-size", "512"]) as server:
        with grpc.insecure_channel(server.wait_for_address()) as channel:
            wait_until_serving(channel)
            stub = pb_grpc.InferenceStub(channel)
            (pid,) = engine_pids(stub).values()
            stream = stub.Generate(greedy("", 24))
            events = [next(stream), next(stream)]
            server.process.send_signal(signal.SIGTERM)
            events += list(stream)
        assert finished_of(events).usage.completion_tokens == 24
        assert server.process.wait(timeout=60) == 0
        assert not alive(pid)
        assert server.logged("stopped")


def test_in_process_engines_have_no_pid_of_their_own() -> None:
    with serving(make_settings(engine_mode="in-process")) as (_, stub):
        (info,) = [m for m in stub.ListModels(pb.ListModelsRequest()).models if m.loaded]
        assert info.engine_pid == 0
        assert info.rss_bytes == 0
        assert finished_of(collect(stub.Generate(greedy(SMOLLM, 2)))).usage.completion_tokens == 2


def test_a_cancelled_stream_frees_its_place_in_the_engine_batch() -> None:
    settings = make_settings(parallel_sequences=1, max_waiting_sequences=0)
    with serving(settings) as (running, stub):
        occupying = stub.Generate(greedy(SMOLLM, 400))
        next(occupying)
        next(occupying)
        model = running.server.pool.loaded()[0]
        assert model.engine.running == 1
        occupying.cancel()
        assert eventually(lambda: model.engine.running == 0)
        assert finished_of(collect(stub.Generate(greedy(SMOLLM, 2)))).usage.completion_tokens == 2
