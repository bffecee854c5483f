"""Through a real server: no Admit or Generate reaches outside the roots the operator allowed.

A models dir and a hub cache in a temporary directory, beside an `outside`
directory holding a real GGUF that must never be served, described or even
told apart from a missing one. Legitimate layouts, a GGUF in a subfolder and
a hub snapshot of blob symlinks, serve the embedded SmolLM2 for real.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

import gguf
import grpc
import pytest

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from service.models.embedded import EMBEDDED_MODELS
from service.models.sources import MAX_MODEL_NAME_LENGTH
from tests.conftest import SMOLLM, collect, finished_of, make_settings, serving
from tests.fixtures import (
    add_hub_file,
    link_or_copy,
    write_checkpoint,
    write_gguf_header,
    write_hub_snapshot,
)

COMMIT = "0123456789abcdef0123456789abcdef01234567"  # the one write_hub_snapshot uses
CALL_TIMEOUT = 120  # seconds; a refusal comes back at once, a load takes a few


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("confinement")
    smol = EMBEDDED_MODELS[SMOLLM].locate()
    outside = root / "outside"
    outside.mkdir()
    ft, q = gguf.LlamaFileType.MOSTLY_Q8_0, gguf.GGMLQuantizationType.Q8_0
    write_gguf_header(outside / "secret.gguf", "llama", ft, [q])
    (outside / "weights.safetensors").write_bytes(b"\0" * 64)
    (outside / "ref").write_text(COMMIT)
    models = root / "models"
    link_or_copy(smol, models / "smol" / "smol.gguf")
    (models / "alias.gguf").symlink_to("smol/smol.gguf")
    (models / "sub").mkdir()
    (models / "sub" / "x.gguf").symlink_to(outside / "secret.gguf")
    write_checkpoint(models / "ckpt", {"model_type": "llama"})
    (models / "ckpt" / "model.safetensors").symlink_to(outside / "weights.safetensors")
    (models / "linkdir").symlink_to(outside)
    snapshot = write_hub_snapshot(root / "hub", "acme/smol", {"README.md": b"SmolLM2"})
    add_hub_file(snapshot, "smol-Q4_1.gguf", smol)
    return root


@pytest.fixture(scope="module")
def stub(tree: Path) -> Iterator[pb_grpc.InferenceStub]:
    settings = make_settings(
        models_dir=[tree / "models"], hf_cache_dir=tree / "hub", hf_offline=True
    )
    with serving(settings) as (_, stub):
        yield stub


def admit(stub: pb_grpc.InferenceStub, model: str) -> pb.AdmitResponse:
    reply: pb.AdmitResponse = stub.Admit(
        pb.AdmitRequest(model=model, capability=pb.CAPABILITY_TEXT), timeout=CALL_TIMEOUT
    )
    return reply


def generate(stub: pb_grpc.InferenceStub, model: str) -> list[pb.GenerateResponse]:
    request = pb.GenerateRequest(model=model, prompt="Hello", max_tokens=2, temperature=0)
    return collect(stub.Generate(request, timeout=CALL_TIMEOUT))


def refusals(stub: pb_grpc.InferenceStub, model: str) -> list[grpc.RpcError]:
    """What Admit and Generate answer for `model`; both must refuse it."""
    calls: list[Callable[[], object]] = [lambda: admit(stub, model), lambda: generate(stub, model)]
    errors = []
    for call in calls:
        with pytest.raises(grpc.RpcError) as caught:
            call()
        errors.append(caught.value)
    return errors


def codes_and_details(errors: list[grpc.RpcError]) -> list[tuple[grpc.StatusCode, str]]:
    return [(error.code(), error.details() or "") for error in errors]


def shape(message: str) -> str:
    """A message with the client's quoted text masked: what is left must not vary."""
    return re.sub(r"'[^']*'(\.\.\. \(\d+ characters\))?", "<quoted>", message)


@pytest.mark.parametrize(
    "template",
    [
        "acme/smol:{outside}/{name}.gguf",  # an absolute path after the colon
        "linkdir/{name}.gguf",  # under a symlinked directory
        "{outside}/{name}.gguf",
    ],
)
def test_an_outside_file_gets_the_same_refusal_whether_it_exists(
    stub: pb_grpc.InferenceStub, tree: Path, template: str
) -> None:
    outside = tree / "outside"
    existing, missing = (
        codes_and_details(refusals(stub, template.format(outside=outside, name=name)))
        for name in ("secret", "absent")
    )
    for (code, details), (other_code, other_details) in zip(existing, missing, strict=True):
        assert code == other_code == grpc.StatusCode.PERMISSION_DENIED
        assert shape(details) == shape(other_details)
        assert "magic" not in details


@pytest.mark.parametrize(
    ("model", "entry"),
    [
        ("sub", "x.gguf"),  # the one GGUF in a directory is a symlink out
        ("ckpt", "model.safetensors"),  # a checkpoint's weights are
        ("linkdir/secret.gguf", ""),  # a directory on the way is
        ("acme/smol@../../../outside/ref", ""),  # a revision climbing out of refs/
        ("acme/smol@{outside}/ref", ""),  # or jumping out of it
        ("../outside/secret.gguf", ""),
        ("{outside}/secret.gguf", ""),
    ],
)
def test_a_request_cannot_reach_outside(
    stub: pb_grpc.InferenceStub, tree: Path, model: str, entry: str
) -> None:
    outside = str(tree / "outside")
    for code, details in codes_and_details(refusals(stub, model.format(outside=outside))):
        assert code == grpc.StatusCode.PERMISSION_DENIED, details
        assert entry in details
        assert "secret" not in details.replace(model.format(outside=outside), "")


@pytest.mark.parametrize("length", [100_000, 15 << 20])
def test_a_huge_name_is_invalid_and_not_echoed(stub: pb_grpc.InferenceStub, length: int) -> None:
    for code, details in codes_and_details(refusals(stub, "m" * length)):
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert f"{MAX_MODEL_NAME_LENGTH} characters" in details
        assert len(details) < 300


@pytest.mark.parametrize("model", ["smol\0.gguf", "smol/smol.gguf\0../../outside"])
def test_a_name_with_nul_is_invalid(stub: pb_grpc.InferenceStub, model: str) -> None:
    for code, _ in codes_and_details(refusals(stub, model)):
        assert code == grpc.StatusCode.INVALID_ARGUMENT


def test_a_gguf_in_a_subfolder_is_served(stub: pb_grpc.InferenceStub) -> None:
    events = generate(stub, "smol")
    assert events[0].started.model == "smol/smol.gguf"  # the file the folder holds
    assert finished_of(events).usage.completion_tokens == 2
    assert admit(stub, "alias.gguf").admitted  # a symlink to elsewhere inside


def test_a_hub_snapshot_of_blob_symlinks_is_served(stub: pb_grpc.InferenceStub) -> None:
    reply = admit(stub, "acme/smol")
    assert reply.admitted, reply.reason
    assert reply.available_locally
    events = generate(stub, "acme/smol:Q4_1")
    assert finished_of(events).usage.completion_tokens == 2
