"""A frozen or stuck engine is noticed, killed and replaced (issue 27).

Before, an engine stopped with SIGSTOP left its streams with no token and no
error, and requests without a deadline queued behind it until every other
model starved. Now the front hears a heartbeat every second and kills an
engine with work that goes silent (or makes no progress) for too long.
"""

from __future__ import annotations

import os
import signal

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from service.engine.liveness import Liveness, Pulse, overdue
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
from tests.test_engine_processes import alive, engine_pids, greedy

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def test_a_stopped_engine_is_killed_and_its_stream_told_why() -> None:
    settings = make_settings(engine_hang_seconds=2, max_concurrent=4)
    with serving(settings) as (running, stub):
        collect(stub.Generate(greedy(GEMMA, 1)))  # loaded
        assert model_health(running, GEMMA) == SERVING
        stalled = engine_pids(stub)[GEMMA]
        stream = stub.Generate(greedy(GEMMA, 900))
        assert next(stream).WhichOneof("event") == "started"
        os.kill(stalled, signal.SIGSTOP)
        try:
            with pytest.raises(grpc.RpcError) as caught:
                list(stream)  # no deadline: before, this waited for ever
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
            details = str(caught.value.details())
            assert "the server killed it" in details
            assert "frozen or stopped" in details
            assert eventually(lambda: not alive(stalled))
        finally:
            if alive(stalled):
                os.kill(stalled, signal.SIGKILL)
        assert eventually(lambda: model_health(running, GEMMA) == NOT_SERVING)
        # The other model served all along; the stopped one starts afresh.
        assert finished_of(collect(stub.Generate(greedy(SMOLLM, 2)))).usage.completion_tokens
        assert finished_of(collect(stub.Generate(greedy(GEMMA, 2)))).usage.completion_tokens
        assert engine_pids(stub)[GEMMA] != stalled
        assert eventually(lambda: model_health(running, GEMMA) == SERVING)


def model_health(running: RunningServer, model: str) -> int:
    """grpc.health.v1's answer for one model (`model/NAME`)."""
    with grpc.insecure_channel(running.target) as channel:
        request = health_pb2.HealthCheckRequest(service=f"model/{model}")
        reply: health_pb2.HealthCheckResponse = health_pb2_grpc.HealthStub(channel).Check(request)
        return int(reply.status)


def test_an_idle_engine_is_never_judged() -> None:
    limits = Liveness(hang_seconds=2, stall_seconds=5)
    pulse = Pulse(heard_at=0.0)
    assert pulse.verdict(100.0, busy=False, limits=limits) is None  # silent, but idle


def test_silence_with_work_is_a_hang() -> None:
    limits = Liveness(hang_seconds=2, stall_seconds=5)
    pulse = Pulse(heard_at=0.0)
    pulse.verdict(0.0, busy=False, limits=limits)
    assert pulse.verdict(1.5, busy=True, limits=limits) is None
    assert "sent nothing for 3 s" in (pulse.verdict(3.0, busy=True, limits=limits) or "")


def test_heartbeats_without_progress_are_a_stall() -> None:
    limits = Liveness(hang_seconds=2, stall_seconds=5)
    pulse = Pulse(heard_at=0.0, progress=7)
    pulse.verdict(0.0, busy=False, limits=limits)
    for second in range(1, 5):
        pulse.heard(float(second), progress=7)  # alive, but its worker stands still
        assert pulse.verdict(float(second), busy=True, limits=limits) is None
    pulse.heard(6.0, progress=7)
    assert "no progress for 6 s" in (pulse.verdict(6.0, busy=True, limits=limits) or "")
    pulse.heard(7.0, progress=8)  # it moved: the clock starts again
    assert pulse.verdict(7.5, busy=True, limits=limits) is None


def test_a_cancelled_image_is_overdue_once_it_outlives_its_cancel_by_the_limit() -> None:
    limits = Liveness(cancel_seconds=5)
    assert overdue([], 100.0, limits) is None  # nothing cancelled
    assert overdue([10.0, 12.0], 14.0, limits) is None
    assert overdue([12.0, 10.0], 16.0, limits) == 6.0  # the oldest cancel counts
