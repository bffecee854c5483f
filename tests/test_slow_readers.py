"""Clients that stop reading cannot pin the server (issue 27).

A raw HTTP/2 client (tests/h2_stall.py) opens Generate streams with a receive
window of 0 on one connection and answers pings, so the server can never
write a byte to them. Before, each such stream kept its slot for as long as
the connection lived; now a slot is held for generating only, a stream
buffers a bounded number of bytes, and one that cannot send for
--send-stall-seconds is cancelled with its generation.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc
import pytest

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from tests.conftest import (
    GEMMA,
    SMOLLM,
    RunningServer,
    collect,
    finished_of,
    make_settings,
    serving,
)
from tests.h2_stall import StalledStreams

GENERATE = "/inference.v1.Inference/Generate"
STORY = pb.GenerateRequest(prompt="Tell me a long story about a ship.", max_tokens=48)


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _load(stub: pb_grpc.InferenceStub) -> pb.ServerLoad:
    reply: pb.ListModelsResponse = stub.ListModels(pb.ListModelsRequest())
    return reply.load


def _stalled_count(running: RunningServer) -> float | None:
    labels = {"rpc": "Generate"}
    return running.server.metrics.registry.get_sample_value(
        "inference_streams_stalled_total", labels
    )


def _served(stub: pb_grpc.InferenceStub, model: str) -> None:
    request = pb.GenerateRequest(model=model, prompt="Hi", max_tokens=2)
    assert finished_of(collect(stub.Generate(request, timeout=60))).usage.completion_tokens == 2


def test_streams_nobody_reads_hold_no_slot_once_generated() -> None:
    settings = make_settings(max_concurrent=3, max_queue=0, send_stall_seconds=600)
    with serving(settings) as (running, stub), StalledStreams(running.target) as stalled:
        _served(stub, SMOLLM)  # loaded before the clock matters
        streams = {stalled.open(GENERATE, STORY) for _ in range(3)}  # as many as the slots
        # Each started (its response headers came: they need no window)...
        _wait_for(lambda: stalled.answered >= streams, "the stalled streams to start")
        # ...and its generation ends and lets go of its slot; the client has read nothing.
        _wait_for(lambda: _load(stub).running == 0, "the stalled streams' slots to free")
        assert stalled.data_bytes == 0
        assert stalled.ended == {}  # still open: only their slots are free
        # Every model is served, at once, beside them.
        _served(stub, SMOLLM)
        _served(stub, GEMMA)


def test_a_stream_that_cannot_send_is_cancelled_with_its_generation() -> None:
    # A buffer of one byte: the generation pauses at its second message, so it holds
    # its slot until the send deadline gives up on the reader.
    settings = make_settings(
        max_concurrent=2, max_queue=0, stream_buffer_bytes=1, send_stall_seconds=2
    )
    with serving(settings) as (running, stub), StalledStreams(running.target) as stalled:
        _served(stub, SMOLLM)
        for _ in range(2):
            stalled.open(GENERATE, STORY)
        _wait_for(lambda: _load(stub).running == 2, "the stalled streams to take both slots")
        # Meanwhile the slots are taken: a plain request is refused, not hung.
        with pytest.raises(grpc.RpcError) as refused:
            _served(stub, SMOLLM)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # Past the send deadline both are cancelled, and the server serves again.
        _wait_for(lambda: _load(stub).running == 0, "the stalled streams to be cancelled")
        _wait_for(lambda: _stalled_count(running) == 2, "both to be counted as stalled")
        _served(stub, SMOLLM)


def test_one_model_cannot_take_every_slot() -> None:
    settings = make_settings(
        max_concurrent=3,
        max_queue=0,
        max_concurrent_per_model=2,
        stream_buffer_bytes=1,
        send_stall_seconds=600,
    )
    with serving(settings) as (running, stub), StalledStreams(running.target) as stalled:
        _served(stub, SMOLLM)
        for _ in range(2):
            stalled.open(GENERATE, STORY)  # the default model: SmolLM2
        _wait_for(lambda: _load(stub).running == 2, "SmolLM2's two slots to be taken")
        with pytest.raises(grpc.RpcError) as refused:
            _served(stub, SMOLLM)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "per-model limits" in str(refused.value.details())
        _served(stub, GEMMA)  # the slot SmolLM2 may not take is Gemma's to use
