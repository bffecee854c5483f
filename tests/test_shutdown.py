"""SIGTERM drains: in-flight streams finish, new ones are refused, the process exits 0."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from tests.server_process import ServerProcess, server_process, wait_until_serving


@pytest.fixture
def server() -> Iterator[ServerProcess]:
    # Gemma, because llama.cpp prints warnings of its own while loading it.
    with server_process(["--grace-period", "20", "--default-model", "gemma3-270m"]) as running:
        yield running


def _draining(channel: grpc.Channel) -> bool:
    """Whether the main port says the server is draining (NOT_SERVING or refusing)."""
    try:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
    except grpc.RpcError as error:
        return bool(error.code() == grpc.StatusCode.UNAVAILABLE)
    return bool(reply.status == health_pb2.HealthCheckResponse.NOT_SERVING)


def test_sigterm_lets_the_stream_in_flight_finish_then_exits_zero(server: ServerProcess) -> None:
    process = server.process
    with grpc.insecure_channel(server.wait_for_address()) as channel:
        wait_until_serving(channel)
        stub = pb_grpc.InferenceStub(channel)
        stream = stub.Generate(
            pb.GenerateRequest(prompt="Count: 1, 2,", max_tokens=40, temperature=0)
        )
        events = [next(stream), next(stream)]  # started, and the first delta
        process.send_signal(signal.SIGTERM)
        events.extend(stream)
        assert events[-1].WhichOneof("event") == "finished"
        assert events[-1].finished.usage.completion_tokens == 40
    assert process.wait(timeout=30) == 0


def test_new_requests_are_refused_while_draining(server: ServerProcess) -> None:
    process = server.process
    with grpc.insecure_channel(server.wait_for_address()) as channel:
        wait_until_serving(channel)
        stub = pb_grpc.InferenceStub(channel)
        stream = stub.Generate(
            pb.GenerateRequest(prompt="Count: 1, 2,", max_tokens=60, temperature=0)
        )
        next(stream)
        process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        while not _draining(channel):  # no fixed sleep: a slow machine takes its time
            assert time.monotonic() < deadline, "the server never started draining"
            time.sleep(0.01)
        with pytest.raises(grpc.RpcError) as caught:
            list(stub.Generate(pb.GenerateRequest(prompt="Hi", max_tokens=1), timeout=5))
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert list(stream)[-1].WhichOneof("event") == "finished"
    assert process.wait(timeout=30) == 0


def test_log_is_json_lines_with_one_summary_per_rpc(server: ServerProcess) -> None:
    with grpc.insecure_channel(server.wait_for_address()) as channel:
        wait_until_serving(channel)
        stub = pb_grpc.InferenceStub(channel)
        list(stub.Generate(pb.GenerateRequest(prompt="Hello", max_tokens=3, temperature=0)))
        with pytest.raises(grpc.RpcError):
            list(stub.Generate(pb.GenerateRequest(prompt="Hello", top_p=2.0)))
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(timeout=30) == 0
    records = [json.loads(line) for line in server.log]  # every line must be JSON
    summaries = [r for r in records if r.get("event") == "rpc"]
    assert [(r["rpc"], r["code"]) for r in summaries] == [
        ("Generate", "OK"),
        ("Generate", "INVALID_ARGUMENT"),
    ]
    ok = summaries[0]
    assert ok["model"] == "gemma3-270m"
    assert ok["backend"] == "llama.cpp"
    assert ok["completion_tokens"] == 3
    assert ok["finish_reason"] == "length"
    assert ok["ttft_ms"] > 0
