"""SIGTERM drains: in-flight streams finish, new ones are refused, the process exits 0."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc


def _read_address(process: subprocess.Popen[str]) -> str:
    assert process.stderr is not None
    for line in process.stderr:
        if not line.startswith("{"):  # llama.cpp writes some lines of its own
            continue
        record = json.loads(line)
        if record.get("event") == "serving":
            return str(record["address"])
    raise AssertionError("the server exited before it was serving")


@pytest.fixture
def server_process() -> Iterator[tuple[subprocess.Popen[str], str]]:
    env = {**os.environ, "INFERENCE_LOG_FORMAT": "json"}
    process = subprocess.Popen(
        [sys.executable, "-m", "service.server", "--listen", "127.0.0.1:0", "--grace-period", "20"],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        address = _read_address(process)
        # Keep reading the log so that the server never blocks on a full pipe.
        threading.Thread(target=process.stderr.read, daemon=True).start()  # type: ignore[union-attr]
        yield process, address
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)
        process.stderr.close()  # type: ignore[union-attr]


def _wait_until_serving(channel: grpc.Channel) -> None:
    stub = health_pb2_grpc.HealthStub(channel)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
        if reply.status == health_pb2.HealthCheckResponse.SERVING:
            return
        time.sleep(0.05)
    raise AssertionError("the server never reported SERVING")


def test_sigterm_lets_the_stream_in_flight_finish_then_exits_zero(
    server_process: tuple[subprocess.Popen[str], str],
) -> None:
    process, address = server_process
    with grpc.insecure_channel(address) as channel:
        _wait_until_serving(channel)
        stub = pb_grpc.InferenceStub(channel)
        stream = stub.Generate(pb.GenerateRequest(prompt="Count: 1, 2,", max_tokens=40))
        events = [next(stream), next(stream)]  # started, and the first delta
        process.send_signal(signal.SIGTERM)
        events.extend(stream)
        assert events[-1].WhichOneof("event") == "finished"
        assert events[-1].finished.usage.completion_tokens == 40
    assert process.wait(timeout=30) == 0


def test_new_requests_are_refused_while_draining(
    server_process: tuple[subprocess.Popen[str], str],
) -> None:
    process, address = server_process
    with grpc.insecure_channel(address) as channel:
        _wait_until_serving(channel)
        stub = pb_grpc.InferenceStub(channel)
        stream = stub.Generate(pb.GenerateRequest(prompt="Count: 1, 2,", max_tokens=60))
        next(stream)
        process.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        with pytest.raises(grpc.RpcError) as caught:
            list(stub.Generate(pb.GenerateRequest(prompt="Hi", max_tokens=1), timeout=5))
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert list(stream)[-1].WhichOneof("event") == "finished"
    assert process.wait(timeout=30) == 0
