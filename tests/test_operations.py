"""What operators and sidecars rely on: health, reflection, the decode ceiling, config."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from service.config import ModelConfig
from service.models.embedded import EMBEDDED_MODELS
from tests.conftest import GEMMA, collect, finished_of, make_settings, serving, text_of

CHATML = (
    "{% for m in messages %}<start_of_turn>{{ m.role }}\n{{ m.content }}<end_of_turn>\n"
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


@pytest.mark.parametrize("service", ["", "inference.v1.Inference"])
def test_health_is_serving_once_the_default_model_is_loaded(
    channel: grpc.Channel, service: str
) -> None:
    reply = health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(service=service)
    )
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_reflection_lists_the_services_and_their_contract(channel: grpc.Channel) -> None:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    requests = iter(
        [
            reflection_pb2.ServerReflectionRequest(list_services=""),
            reflection_pb2.ServerReflectionRequest(file_containing_symbol="inference.v1.Inference"),
        ]
    )
    listed, described = list(stub.ServerReflectionInfo(requests))
    names = {service.name for service in listed.list_services_response.service}
    assert {"inference.v1.Inference", "grpc.health.v1.Health"} <= names
    assert described.file_descriptor_response.file_descriptor_proto


@pytest.fixture(scope="module")
def tight_stub() -> Iterator[pb_grpc.InferenceStub]:
    """A second server: a short decode ceiling and an operator-supplied chat template."""
    gemma_path = EMBEDDED_MODELS[GEMMA].locate()
    settings = make_settings(
        default_model=GEMMA,
        max_decode_seconds=0.3,
        models={
            "gemma-chat": ModelConfig(
                source=str(gemma_path), chat_template=CHATML, context_size=512
            )
        },
    )
    with serving(settings) as (_, stub):
        yield stub


def test_decode_ceiling_ends_with_time_limit_and_keeps_the_text(
    tight_stub: pb_grpc.InferenceStub,
) -> None:
    events = collect(
        tight_stub.Generate(
            pb.GenerateRequest(prompt="Count: 1, 2,", max_tokens=500, temperature=0)
        )
    )
    finished = finished_of(events)
    assert finished.finish_reason == pb.FINISH_REASON_TIME_LIMIT
    assert 0 < finished.usage.completion_tokens < 500
    assert text_of(events)


def test_operator_template_enables_chat_on_a_model_without_one(
    tight_stub: pb_grpc.InferenceStub,
) -> None:
    request = pb.GenerateRequest(
        model="gemma-chat",
        messages=[pb.ChatMessage(role="user", content="Hello")],
        max_tokens=4,
        temperature=0,
    )
    events = collect(tight_stub.Generate(request))
    assert events[0].started.model == "gemma-chat"
    assert events[0].started.context_length == 512
    # The template text was parsed into Gemma's special tokens, not spelled out.
    assert events[0].started.prompt_tokens < 15
    assert finished_of(events).usage.completion_tokens >= 1


@pytest.mark.slow  # a fresh interpreter importing the whole front
def test_start_up_imports_no_heavy_library() -> None:
    """torch, diffusers and mlx take seconds to import; health must not wait for them."""
    heavy = ("torch", "diffusers", "transformers", "mlx_lm", "llama_cpp")
    code = f"import service.front.server, sys; print([m for m in {heavy!r} if m in sys.modules])"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_health_port_reports_not_serving_for_both_names_while_draining() -> None:
    """The main port refuses new RPCs during a drain; the health port says why."""
    with serving(make_settings(health_listen="127.0.0.1:0")) as (running, stub):
        stream = stub.Generate(
            pb.GenerateRequest(prompt="Count: 1, 2,", max_tokens=400, temperature=0), timeout=60
        )
        next(stream)
        drain = threading.Thread(target=running.run, args=(running.server.stop(grace=30),))
        with grpc.insecure_channel(f"127.0.0.1:{running.server.health_port}") as channel:
            health_stub = health_pb2_grpc.HealthStub(channel)

            def status(service: str) -> int:
                request = health_pb2.HealthCheckRequest(service=service)
                return int(health_stub.Check(request, timeout=5).status)

            names = ("", "inference.v1.Inference")
            assert {status(n) for n in names} == {health_pb2.HealthCheckResponse.SERVING}
            drain.start()
            deadline = time.monotonic() + 10
            while status("") != health_pb2.HealthCheckResponse.NOT_SERVING:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            assert {status(n) for n in names} == {health_pb2.HealthCheckResponse.NOT_SERVING}
        assert list(stream)[-1].WhichOneof("event") == "finished"
        drain.join(timeout=60)
