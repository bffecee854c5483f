"""A Generate that waits for its model's load says so before it starts (issue 46)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from clients.cli import main
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from service.config import ModelConfig
from tests.conftest import SMOLLM, RunningServer, collect, make_settings, serving


@pytest.fixture(scope="module")
def two_models(tiny_model: Path) -> Iterator[tuple[RunningServer, pb_grpc.InferenceStub]]:
    """SmolLM2 and the tiny model, one loaded at a time: each switch loads."""
    tiny = ModelConfig(source=str(tiny_model))
    settings = make_settings(models={"tiny": tiny}, max_loaded_models=1)
    with serving(settings) as running:
        yield running


def _kinds(events: list[pb.GenerateResponse]) -> list[str]:
    return [str(event.WhichOneof("event")) for event in events]


def test_a_load_is_announced_once_before_the_stream_starts(
    two_models: tuple[RunningServer, pb_grpc.InferenceStub],
) -> None:
    running, stub = two_models
    request = pb.GenerateRequest(model="tiny", prompt="Hello", max_tokens=2, report_loading=True)
    first = collect(stub.Generate(request))
    assert _kinds(first)[:2] == ["loading", "started"]
    assert first[0].loading.model == "tiny"
    assert _kinds(first).count("loading") == 1
    again = collect(stub.Generate(request))  # loaded now: nothing to wait for
    assert "loading" not in _kinds(again)
    assert [model.name for model in running.server.pool.loaded()] == ["tiny"]


def test_a_load_is_not_announced_unless_asked(
    two_models: tuple[RunningServer, pb_grpc.InferenceStub],
) -> None:
    _, stub = two_models
    collect(stub.Generate(pb.GenerateRequest(model="tiny", prompt="Hi", max_tokens=1)))
    events = collect(stub.Generate(pb.GenerateRequest(model=SMOLLM, prompt="Hi", max_tokens=1)))
    assert _kinds(events)[0] == "started"  # the stream as clients have always read it


def test_the_client_shows_the_load_on_its_own_line(
    two_models: tuple[RunningServer, pb_grpc.InferenceStub],
    capsys: pytest.CaptureFixture[str],
) -> None:
    running, stub = two_models
    collect(stub.Generate(pb.GenerateRequest(model="tiny", prompt="Hi", max_tokens=1)))
    argv = ["--target", running.target, "generate", "--model", SMOLLM, "--max-tokens", "2"]
    assert main([*argv, "Hello"]) == 0
    assert f"loading {SMOLLM}...\n" in capsys.readouterr().err
