"""Many clients at once, mixing models, cancellations and bad requests: nothing is lost."""

from __future__ import annotations

import random
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from tests.conftest import GEMMA, SMOLLM, make_settings, serving

REQUESTS = 40


def one_request(stub: pb_grpc.InferenceStub, index: int) -> str:
    """A request of a kind chosen by its index; returns what happened."""
    choice = random.Random(index)
    model = choice.choice([SMOLLM, GEMMA])
    kind = index % 5
    if kind == 0:
        with pytest.raises(grpc.RpcError) as caught:
            list(stub.Generate(pb.GenerateRequest(model=model, prompt="hi", top_p=3)))
        return caught.value.code().name
    if kind == 1:
        call = stub.Generate(pb.GenerateRequest(model=model, prompt="Count:", max_tokens=200))
        next(call)
        call.cancel()
        return "cancelled"
    if kind == 2:
        return "admitted" if stub.Admit(pb.AdmitRequest(model=model)).admitted else "refused"
    max_tokens = choice.randint(1, 12)
    request = pb.GenerateRequest(model=model, prompt="Hello", max_tokens=max_tokens, temperature=0)
    events = list(stub.Generate(request))
    finished = events[-1].finished
    deltas = sum(len(e.delta.token_ids) for e in events[1:-1])
    assert events[0].started.model == model
    assert finished.usage.completion_tokens == deltas
    assert finished.usage.completion_tokens <= max_tokens
    return "generated"


def test_mixed_concurrent_load_is_served_and_the_server_stays_healthy() -> None:
    # A budget that holds one model at a time, so loads and evictions interleave too.
    with serving(make_settings(max_loaded_models=1, load_wait=60)) as (running, stub):
        with ThreadPoolExecutor(max_workers=8) as pool:
            outcomes = Counter(pool.map(lambda i: one_request(stub, i), range(REQUESTS)))
        assert outcomes == Counter(
            {"INVALID_ARGUMENT": 8, "cancelled": 8, "admitted": 8, "generated": 16}
        )
        assert all(m.active_requests == 0 for m in running.server.pool.loaded())
        assert len(running.server.pool.loaded()) == 1
        assert running.server.pool.stats.evictions  # the two models took turns
        final = list(stub.Generate(pb.GenerateRequest(prompt="Hi", max_tokens=2, temperature=0)))
        assert final[-1].finished.usage.completion_tokens == 2
