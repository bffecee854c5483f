"""Request ids: the client's x-request-id (or a fresh one) comes back and is on every log line."""

from __future__ import annotations

import json

import grpc
import pytest

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from tests.conftest import GEMMA
from tests.server_process import server_process, wait_until_serving

HI = pb.GenerateRequest(prompt="Hi", max_tokens=1, temperature=0)


def returned_id(call: grpc.Call) -> str:
    value = dict(call.initial_metadata())["x-request-id"]
    assert isinstance(value, str)
    return value


def test_a_streaming_call_gets_its_own_id_back(stub: pb_grpc.InferenceStub) -> None:
    call = stub.Generate(HI, metadata=[("x-request-id", "trace-7f3a")], timeout=60)
    list(call)
    assert returned_id(call) == "trace-7f3a"


def test_a_unary_call_without_an_id_gets_a_fresh_one(stub: pb_grpc.InferenceStub) -> None:
    ids = set()
    for _ in range(2):
        _, call = stub.ListModels.with_call(pb.ListModelsRequest(), timeout=10)
        ids.add(returned_id(call))
    assert len(ids) == 2
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)


@pytest.mark.parametrize("bad", ["has spaces", "x" * 129, ""])
def test_an_unusable_id_is_replaced(stub: pb_grpc.InferenceStub, bad: str) -> None:
    _, call = stub.ListModels.with_call(
        pb.ListModelsRequest(), metadata=[("x-request-id", bad)], timeout=10
    )
    assert returned_id(call) not in (bad, "")


def test_a_failed_call_returns_its_id_in_a_trailers_only_response(
    stub: pb_grpc.InferenceStub,
) -> None:
    """Nothing goes back before the status, so a proxy may still retry the call elsewhere."""
    call = stub.Generate(
        pb.GenerateRequest(model="no-such-model", prompt="Hi"),
        metadata=[("x-request-id", "failing-1")],
        timeout=10,
    )
    with pytest.raises(grpc.RpcError) as caught:
        list(call)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert dict(call.trailing_metadata())["x-request-id"] == "failing-1"
    assert "x-request-id" not in dict(call.initial_metadata())


def test_every_log_line_of_a_request_carries_its_id() -> None:
    with server_process(env={"INFERENCE_THREADS": "2"}) as server:
        with grpc.insecure_channel(server.wait_for_address()) as channel:
            wait_until_serving(channel)
            stub = pb_grpc.InferenceStub(channel)
            request = pb.GenerateRequest(model=GEMMA, prompt="Hi", max_tokens=1, temperature=0)
            list(stub.Generate(request, metadata=[("x-request-id", "log-42")], timeout=60))
        server.process.terminate()
        server.process.wait(timeout=30)
    lines = [json.loads(line) for line in server.log if line.startswith("{")]
    mine = [line for line in lines if line.get("request_id") == "log-42"]
    events = {line["event"] for line in mine}
    assert {"model loaded", "rpc"} <= events  # the load happened inside the request
    assert all(line.get("request_id") in (None, "log-42") for line in lines)
