"""Request ids: the client's x-request-id (or a fresh one) comes back and is on every log line."""

from __future__ import annotations

import json

import grpc
import pytest

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from service.admission.gates import llama_cpp_computes_on_gpu
from service.backends.names import kv_layout_on
from tests.conftest import GEMMA
from tests.server_process import server_process, wait_until_serving

HI = pb.GenerateRequest(prompt="Hi", max_tokens=1, temperature=0)
HI_GEMMA = pb.GenerateRequest(model=GEMMA, prompt="Hi", max_tokens=1, temperature=0)


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


def test_the_engine_s_lines_about_a_request_carry_its_id_too() -> None:
    """Only the engine can tell that this prompt and max_tokens overflow the context (it
    holds the tokenizer), so the request fails there: the engine's lines about it, read
    back from the front's log where they are relayed, name the same request as the
    front's own summary line. A request that succeeds is followed, at debug, onto the
    engine's preparation thread."""
    env = {"INFERENCE_THREADS": "2", "INFERENCE_LOG_LEVEL": "debug"}
    with server_process(env=env) as server:
        with grpc.insecure_channel(server.wait_for_address()) as channel:
            wait_until_serving(channel)
            stub = pb_grpc.InferenceStub(channel)
            request = pb.GenerateRequest(model=GEMMA, prompt="Hi", max_tokens=30000)
            with pytest.raises(grpc.RpcError) as caught:
                list(stub.Generate(request, metadata=[("x-request-id", "engine-29")], timeout=60))
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            list(stub.Generate(HI_GEMMA, metadata=[("x-request-id", "engine-ok")], timeout=60))
        server.process.terminate()
        server.process.wait(timeout=30)
    lines = [json.loads(line) for line in server.log if line.startswith("{")]
    loads = [line for line in lines if line["event"] == "model loaded"]
    engine_pid = next(line["engine_pid"] for line in loads if line["model"] == GEMMA)
    # The load line says which KV layout "auto" became (the shared pool on the CPU).
    layout = kv_layout_on("auto", on_gpu=llama_cpp_computes_on_gpu())
    assert {line["kv_layout"] for line in loads if line["model"] == GEMMA} == {layout}
    mine = [line for line in lines if line.get("request_id") == "engine-29"]
    # The relay stamps each line an engine wrote with that engine's pid.
    from_engine = {line["event"] for line in mine if line.get("engine_pid") == engine_pid}
    assert {"request received", "request ended with error"} <= from_engine
    assert engine_pid != server.process.pid
    ended = next(line for line in mine if line["event"] == "request ended with error")
    assert (ended["code"], ended["model"]) == ("INVALID_ARGUMENT", GEMMA)
    summary = next(line for line in mine if line["event"] == "rpc")
    assert summary["code"] == "INVALID_ARGUMENT"
    assert "engine_pid" not in summary  # the front's own line
    served = {line["event"] for line in lines if line.get("request_id") == "engine-ok"}
    assert {"request received", "request prepared", "request ended", "rpc"} <= served
