"""The external image command, run for real as a subprocess (a stand-in honouring mflux's flags)."""

from __future__ import annotations

import io
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from PIL import Image

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from service.config import ModelConfig
from service.images.external import ExternalRoute, ImageCommand, command_line
from service.images.requests import ImageRequest
from tests.conftest import make_settings, serving

STUB = Path(__file__).with_name("mflux_stub.py")


def wrapper(directory: Path, name: str, behave: str, *extra: str) -> Path:
    """An executable that runs the stand-in with a fixed behaviour."""
    path = directory / name
    arguments = " ".join([f"--behave {behave}", *extra])
    path.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{STUB}" "$@" {arguments}\n')
    path.chmod(0o755)
    return path


def broken(directory: Path, name: str) -> Path:
    """A managed copy that exists but cannot run (its environment is gone)."""
    path = directory / name
    path.write_text("#!/bin/sh\necho 'ModuleNotFoundError: No module named mflux' >&2\nexit 1\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def commands(tmp_path: Path) -> Path:
    return tmp_path


def image_server(command: Path | str, **overrides: Any) -> Any:
    settings: dict[str, Any] = {"image_command": str(command), "image_command_timeout": 30}
    settings.update(overrides)
    return serving(make_settings(**settings))


def image_request(model: str = "schnell", **fields: Any) -> pb.GenerateImageRequest:
    values: dict[str, Any] = {"prompt": "a red apple", "width": 64, "height": 32, "steps": 3}
    values.update(fields)
    return pb.GenerateImageRequest(model=model, seed=7, **values)


def test_command_line_follows_the_mflux_contract() -> None:
    request = ImageRequest("m", "a cat", "", 512, 256, 4, 3.5, 42)
    command = ImageCommand("/bin/mflux-generate", frozenset({"schnell"}))
    builtin = command_line(command, ExternalRoute("schnell", "schnell"), request, Path("/t/o.png"))
    assert builtin == [
        "/bin/mflux-generate", "--base-model", "schnell", "--prompt", "a cat",
        "--output", "/t/o.png", "--seed", "42",
        "--width", "512", "--height", "256", "--steps", "4", "--guidance", "3.5",
    ]  # fmt: skip
    repo = ExternalRoute("lite", "dev", "acme/flux-lite")
    assert command_line(command, repo, request, Path("o.png"))[1:5] == [
        "--base-model", "dev", "--model", "acme/flux-lite",
    ]  # fmt: skip


def test_a_builtin_name_streams_progress_then_the_png(commands: Path) -> None:
    with image_server(wrapper(commands, "mflux-generate", "ok")) as (_, stub):
        admit = stub.Admit(pb.AdmitRequest(model="schnell", capability=pb.CAPABILITY_IMAGE))
        assert admit.admitted, admit.reason
        assert admit.backend == "mflux"
        events = list(stub.GenerateImage(image_request()))
    steps = [(e.progress.step, e.progress.total_steps) for e in events[:-1]]
    assert steps == [(1, 3), (2, 3), (3, 3)]
    image = events[-1].image
    assert (image.width, image.height, image.seed) == (64, 32, 7)
    assert (image.model, image.backend, image.media_type) == ("schnell", "mflux", "image/png")
    with Image.open(io.BytesIO(image.data)) as png:
        assert (png.format, png.size) == ("PNG", (64, 32))


def test_a_configured_hub_checkpoint_goes_external_with_its_family(
    commands: Path, tmp_path: Path
) -> None:
    models = {"lite": ModelConfig(source="acme/flux-lite", backend="external", base_model="dev")}
    output_dir = tmp_path / "saved"
    command = wrapper(commands, "mflux-generate", "ok")
    with image_server(command, models=models, image_output_dir=output_dir) as (_, stub):
        image = list(stub.GenerateImage(image_request("lite")))[-1].image
        models_listed = {m.name: m for m in stub.ListModels(pb.ListModelsRequest()).models}
    assert image.backend == "mflux"
    assert list(models_listed["lite"].capabilities) == [pb.CAPABILITY_IMAGE]
    (saved,) = output_dir.glob("*.png")
    assert saved.read_bytes() == image.data


@pytest.mark.parametrize(
    ("behave", "timeout", "code", "words"),
    [
        # A timeout that a loaded machine starting Python cannot reach by accident...
        ("fail", 60, grpc.StatusCode.INTERNAL, "out of memory while loading"),
        ("nothing", 60, grpc.StatusCode.INTERNAL, "wrote no image"),
        # ...and a short one where it is what the test is about.
        ("hang", 1, grpc.StatusCode.DEADLINE_EXCEEDED, "took longer than 1 s"),
    ],
)
def test_command_failures_get_a_clear_status(
    commands: Path, behave: str, timeout: int, code: grpc.StatusCode, words: str
) -> None:
    command = wrapper(commands, "mflux-generate", behave)
    with image_server(command, image_command_timeout=timeout) as (_, stub):
        with pytest.raises(grpc.RpcError) as caught:
            list(stub.GenerateImage(image_request()))
        assert caught.value.code() == code
        assert words in (caught.value.details() or "")
        # The server is still serving.
        assert stub.ListModels(pb.ListModelsRequest()).default_model


def test_a_missing_command_is_failed_precondition(commands: Path) -> None:
    with image_server(commands / "not-installed") as (_, stub):
        admit = stub.Admit(pb.AdmitRequest(model="schnell", capability=pb.CAPABILITY_IMAGE))
        assert not admit.admitted
        assert "not found or does not run" in admit.reason
        with pytest.raises(grpc.RpcError) as caught:
            list(stub.GenerateImage(image_request()))
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_the_managed_copy_is_preferred_only_when_it_runs(commands: Path) -> None:
    on_path = wrapper(commands, "mflux-on-path", "ok")
    with image_server(on_path, image_command_managed=broken(commands, "managed")) as (_, stub):
        admit = stub.Admit(pb.AdmitRequest(model="schnell", capability=pb.CAPABILITY_IMAGE))
        assert "mflux-on-path serves" in admit.reason
    managed = wrapper(commands, "managed-ok", "ok")
    with image_server(on_path, image_command_managed=managed) as (_, stub):
        admit = stub.Admit(pb.AdmitRequest(model="schnell", capability=pb.CAPABILITY_IMAGE))
        assert "managed-ok serves" in admit.reason


def test_cancelling_the_request_kills_the_command(commands: Path, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    command = wrapper(commands, "mflux-generate", "hang", f"--pid-file {pid_file}")
    with image_server(command) as (_, stub):
        call = stub.GenerateImage(image_request())
        assert next(call).progress.step == 1
        call.cancel()
        pid = int(pid_file.read_text())
        deadline = time.monotonic() + 60  # a bound on a hang, not on speed
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(pid)


def _alive(pid: int) -> bool:
    """Whether the process runs; a zombie (killed, not yet reaped) does not count."""
    try:
        os.kill(pid, 0)
        # The server may reap it between the two calls: then /proc has no entry.
        status = Path(f"/proc/{pid}/status").read_text()
    except (ProcessLookupError, FileNotFoundError):
        return False
    return "zombie" not in status


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"width": 60}, "multiple of 8"),
        ({"height": 0}, "multiple of 8"),
        ({"width": 4096}, "at most 2048"),
        ({"steps": 0}, "steps"),
        ({"steps": 1000}, "steps"),
        ({"prompt": " "}, "prompt"),
        ({"guidance": -1.0}, "guidance"),
    ],
)
def test_limits_are_invalid_argument(
    stub_for_limits: pb_grpc.InferenceStub, fields: dict[str, Any], words: str
) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        list(stub_for_limits.GenerateImage(image_request(**fields)))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert words in (caught.value.details() or "")


@pytest.fixture(scope="module")
def stub_for_limits(tmp_path_factory: pytest.TempPathFactory) -> Iterator[pb_grpc.InferenceStub]:
    command = wrapper(tmp_path_factory.mktemp("limits"), "mflux-generate", "ok")
    with image_server(command) as (_, stub):
        yield stub


def test_client_image_command_saves_the_png_and_shows_progress(
    commands: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from clients.cli import main

    out = tmp_path / "apple.png"
    with image_server(wrapper(commands, "mflux-generate", "ok")) as (running, _):
        argv = ["--target", running.target, "image", "a red apple", "--out", str(out)]
        code = main([*argv, "--model", "schnell", "--width", "32", "--height", "48", "--seed", "3"])
    err = capsys.readouterr().err
    assert code == 0
    assert "step 4/4" in err
    assert "32x48" in err
    with Image.open(out) as png:
        assert png.size == (32, 48)


def test_an_empty_model_uses_the_default_image_model_or_says_so(commands: Path) -> None:
    command = wrapper(commands, "mflux-generate", "ok")
    with image_server(command) as (_, stub):
        with pytest.raises(grpc.RpcError) as caught:
            list(stub.GenerateImage(image_request(model="")))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "--default-image-model" in (caught.value.details() or "")
        with pytest.raises(grpc.RpcError) as caught:
            stub.Admit(pb.AdmitRequest(model="schnell", capability=7))  # type: ignore[arg-type]
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with image_server(command, default_image_model="schnell") as (_, stub):
        image = list(stub.GenerateImage(image_request(model="")))[-1].image
        assert (image.model, image.backend) == ("schnell", "mflux")
