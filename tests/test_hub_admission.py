"""Admit on hub models that are not downloaded: answered from the hub's metadata alone.

A real server talks to tests/fake_hub.py (the hub's HTTP interface on loopback,
serving real files), which counts every body byte it sends: the point of these
tests is as much what did not move as what the answer says.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from service.admission.gguf_header import read_gguf_header
from service.hub.ranged import BLOCK, RUN_BLOCKS
from service.models.embedded import EMBEDDED_MODELS
from tests.conftest import SMOLLM, make_settings, serving
from tests.fake_hub import FakeHub, FakeRepo
from tests.fixtures import write_checkpoint

SMOLLM_FILE = EMBEDDED_MODELS[SMOLLM].locate()
SMOLLM_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
AWQ_CONFIG = {
    "model_type": "llama",
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "hidden_size": 64,
    "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128},
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small llama checkpoint on disk, which the hub also serves."""
    directory = write_checkpoint(
        tmp_path_factory.mktemp("models") / "tiny-llama", {"model_type": "llama"}, 4096
    )
    (directory / "tokenizer.json").write_text("{}")
    return directory


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A diffusers pipeline's layout (no real weights: admission reads none): two
    components, one with both safetensors and .bin weights, and a folder it does not name."""
    directory = tmp_path_factory.mktemp("pipelines") / "tiny-sd"
    index = {
        "_class_name": "StableDiffusionPipeline",
        "unet": ["diffusers", "UNet2DConditionModel"],
    }
    index["vae"] = ["diffusers", "AutoencoderKL"]
    header = json.dumps({"w": {"dtype": "F16", "shape": [4], "data_offsets": [0, 8]}}).encode()
    safetensors = len(header).to_bytes(8, "little") + header + b"\0" * 8
    files = {
        "model_index.json": json.dumps(index).encode(),
        "unet/config.json": b"{}",
        "unet/diffusion_pytorch_model.safetensors": safetensors,
        "unet/diffusion_pytorch_model.bin": b"\0" * 4096,
        "vae/config.json": b"{}",
        "vae/diffusion_pytorch_model.safetensors": safetensors,
        "extras/notes.bin": b"\0" * 64,
    }
    for name, data in files.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_bytes(data)
    return directory


@pytest.fixture(scope="module")
def hub(checkpoint: Path, pipeline: Path) -> Iterator[FakeHub]:
    def files_of(directory: Path) -> dict[str, bytes | Path]:
        return {path.name: path for path in directory.iterdir()}

    fake = FakeHub(
        repos={
            "acme/smol-gguf": FakeRepo({SMOLLM_NAME: SMOLLM_FILE, "README.md": b"# SmolLM2"}),
            "acme/multi-quant": FakeRepo(
                {"smol.Q4_1.gguf": SMOLLM_FILE, "smol.Q8_0.gguf": b"GGUF" + b"\0" * 2048}
            ),
            "acme/awq": FakeRepo(
                {
                    "config.json": json.dumps(AWQ_CONFIG).encode(),
                    "model.safetensors": b"\0" * 8192,
                }
            ),
            "acme/tiny-llama": FakeRepo(files_of(checkpoint)),
            "acme/tiny-sd": FakeRepo(
                {
                    path.relative_to(pipeline).as_posix(): path
                    for path in pipeline.rglob("*")
                    if path.is_file()
                }
            ),
            "acme/gated": FakeRepo({SMOLLM_NAME: SMOLLM_FILE}, token="hf_let_me_in"),
        }
    ).start()
    yield fake
    fake.stop()


@pytest.fixture(scope="module")
def stub(
    hub: FakeHub, checkpoint: Path, pipeline: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[pb_grpc.InferenceStub]:
    settings = make_settings(
        models_dir=[checkpoint.parent, pipeline.parent],
        hf_cache_dir=tmp_path_factory.mktemp("hub-cache"),
        hf_offline=False,
        hf_endpoint=hub.url,
        hf_token=None,
    )
    with serving(settings) as (_, stub):
        yield stub


def admit(
    stub: pb_grpc.InferenceStub, model: str, capability: pb.Capability = pb.CAPABILITY_TEXT
) -> pb.AdmitResponse:
    reply: pb.AdmitResponse = stub.Admit(pb.AdmitRequest(model=model, capability=capability))
    return reply


def test_a_gguf_repo_is_admitted_from_its_header_alone(
    stub: pb_grpc.InferenceStub, hub: FakeHub
) -> None:
    reply = admit(stub, "acme/smol-gguf")
    assert reply.admitted, reply.reason
    assert (reply.backend, reply.architecture) == ("llama.cpp", "llama")
    assert reply.quantization.method == "Q4_1"
    assert not reply.available_locally
    size = SMOLLM_FILE.stat().st_size
    assert [(f.path, f.size_bytes) for f in reply.download.files] == [(SMOLLM_NAME, size)]
    assert reply.download.total_bytes == size
    assert reply.download.fits_on_disk
    assert reply.download.commit == hub.repos["acme/smol-gguf"].commit
    assert f"a download of {size} bytes (1 file)" in reply.reason
    # What admission reads of the header (arrays it needs not are skipped, unfetched),
    # and at most one run of blocks past it.
    header_end = read_gguf_header(SMOLLM_FILE).data_start
    sent = hub.bytes_sent("acme/smol-gguf", SMOLLM_NAME)
    assert 0 < sent <= header_end + RUN_BLOCKS * BLOCK
    assert sent < size / 10


def test_the_same_repo_asked_again_reads_no_header_again(
    stub: pb_grpc.InferenceStub, hub: FakeHub
) -> None:
    admit(stub, "acme/smol-gguf")
    before = hub.bytes_sent("acme/smol-gguf")
    assert admit(stub, "acme/smol-gguf").admitted
    assert hub.bytes_sent("acme/smol-gguf") == before


def test_a_quantization_tag_picks_one_file_of_a_multi_quant_repo(
    stub: pb_grpc.InferenceStub, hub: FakeHub
) -> None:
    reply = admit(stub, "acme/multi-quant:Q4_1")
    assert reply.admitted, reply.reason
    assert [f.path for f in reply.download.files] == ["smol.Q4_1.gguf"]
    assert hub.bytes_sent("acme/multi-quant", "smol.Q8_0.gguf") == 0
    with pytest.raises(grpc.RpcError) as caught:
        admit(stub, "acme/multi-quant")
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = str(caught.value.details())
    assert "several GGUF files" in details
    # The choices, with their sizes, to pick one from.
    size = hub.repos["acme/multi-quant"].files["smol.Q8_0.gguf"]
    assert isinstance(size, bytes)
    assert f"'smol.Q8_0.gguf' {len(size) / 1e9:.2f} GB" in details
    assert "'smol.Q4_1.gguf'" in details


def test_an_awq_repo_is_refused_without_a_weight_byte_moving(
    stub: pb_grpc.InferenceStub, hub: FakeHub
) -> None:
    reply = admit(stub, "acme/awq")
    assert not reply.admitted
    assert "awq" in reply.reason
    assert reply.quantization.method == "awq"
    assert reply.download.total_bytes > 0  # what it would have taken
    assert hub.bytes_sent("acme/awq", "model.safetensors") == 0
    assert hub.bytes_sent("acme/awq", "config.json") == len(json.dumps(AWQ_CONFIG))


def test_a_checkpoint_gets_the_answer_its_local_copy_gets(
    stub: pb_grpc.InferenceStub, hub: FakeHub
) -> None:
    remote = admit(stub, "acme/tiny-llama")
    local = admit(stub, "tiny-llama")  # the same files under --models-dir
    assert local.available_locally
    assert not remote.available_locally
    for field in ("admitted", "backend", "architecture"):
        assert getattr(remote, field) == getattr(local, field), field
    assert remote.quantization == local.quantization
    assert remote.reason.startswith(local.reason)
    assert remote.memory.weights_bytes == local.memory.weights_bytes
    names = sorted(f.path for f in remote.download.files)
    assert names == ["config.json", "model.safetensors", "tokenizer.json"]
    assert hub.bytes_sent("acme/tiny-llama", "model.safetensors") == 0


def test_a_pipeline_gets_its_local_answer_and_its_folders(
    stub: pb_grpc.InferenceStub, hub: FakeHub
) -> None:
    remote = admit(stub, "acme/tiny-sd", pb.CAPABILITY_IMAGE)
    local = admit(stub, "tiny-sd", pb.CAPABILITY_IMAGE)
    assert (remote.admitted, remote.backend, remote.architecture) == (
        local.admitted,
        local.backend,
        local.architecture,
    )
    assert remote.quantization.method == local.quantization.method == "float16"
    assert sorted(f.path for f in remote.download.files) == [
        "model_index.json",
        "unet/config.json",
        "unet/diffusion_pytorch_model.safetensors",
        "vae/config.json",
        "vae/diffusion_pytorch_model.safetensors",
    ]
    assert hub.bytes_sent("acme/tiny-sd", "unet/diffusion_pytorch_model.bin") == 0
    text = admit(stub, "acme/tiny-sd")
    assert not text.admitted
    assert "GenerateImage" in text.reason


def test_the_hubs_refusals_are_statuses(stub: pb_grpc.InferenceStub) -> None:
    for model, code in [
        ("acme/missing", grpc.StatusCode.NOT_FOUND),
        ("acme/smol-gguf@v9", grpc.StatusCode.NOT_FOUND),
        ("acme/gated", grpc.StatusCode.PERMISSION_DENIED),
        ("acme/smol-gguf:Q8_0", grpc.StatusCode.NOT_FOUND),
    ]:
        with pytest.raises(grpc.RpcError) as caught:
            admit(stub, model)
        assert caught.value.code() == code, model
    with pytest.raises(grpc.RpcError) as caught:
        admit(stub, "acme/gated")
    assert "--hf-token" in str(caught.value.details())


def test_a_token_opens_a_gated_repo(hub: FakeHub, tmp_path: Path) -> None:
    settings = make_settings(
        hf_cache_dir=tmp_path, hf_offline=False, hf_endpoint=hub.url, hf_token="hf_let_me_in"
    )
    with serving(settings) as (_, stub):
        assert admit(stub, "acme/gated").admitted


def test_offline_mode_asks_the_hub_nothing(hub: FakeHub, tmp_path: Path) -> None:
    asked = len(hub.requests)
    settings = make_settings(hf_cache_dir=tmp_path, hf_offline=True, hf_endpoint=hub.url)
    with serving(settings) as (_, stub):
        reply = admit(stub, "acme/smol-gguf")
        assert not reply.admitted
        assert "offline" in reply.reason
        assert not reply.HasField("download")
    assert len(hub.requests) == asked


def test_generate_on_a_model_not_downloaded_says_how_to_get_it(
    stub: pb_grpc.InferenceStub, hub: FakeHub
) -> None:
    before = hub.bytes_sent("acme/smol-gguf")
    with pytest.raises(grpc.RpcError) as caught:
        list(stub.Generate(pb.GenerateRequest(model="acme/smol-gguf", prompt="hi", max_tokens=1)))
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "hf download acme/smol-gguf" in str(caught.value.details())
    assert hub.bytes_sent("acme/smol-gguf") == before
