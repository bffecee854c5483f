"""The diffusers backend on a tiny real Stable Diffusion pipeline, built and saved here."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from PIL import Image
from PIL.PngImagePlugin import PngImageFile

from service.backends.diffusers_pipeline import (
    BACKEND_NAME,
    DiffusersBackend,
    DiffusersOptions,
)
from service.errors import BackendFailure, NotSupported
from service.images.backend import GenerationCancelled
from service.images.requests import ImageRequest, RenderedImage

OPTIONS = DiffusersOptions(threads=1)  # see make_settings: one thread never waits
APPLE = ImageRequest(
    model="tiny-sd",
    prompt="a red apple on a table",
    negative_prompt="",
    width=64,
    height=64,
    steps=2,
    guidance=None,
    seed=7,
)

Steps = list[tuple[int, int]]


@pytest.fixture(scope="module")
def pipeline_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.tiny_pipeline import build_tiny_sd_pipeline  # torch: imported where needed

    return build_tiny_sd_pipeline(tmp_path_factory.mktemp("diffusers") / "tiny-sd")


@pytest.fixture(scope="module")
def backend(pipeline_dir: Path) -> Iterator[DiffusersBackend]:
    backend = DiffusersBackend(pipeline_dir, OPTIONS)
    yield backend
    backend.close()


def render(
    backend: DiffusersBackend,
    request: ImageRequest,
    cancelled: threading.Event | None = None,
    also: Callable[[int, int], None] | None = None,
) -> tuple[RenderedImage, Steps]:
    steps: Steps = []

    def on_step(step: int, total: int) -> None:
        steps.append((step, total))
        if also is not None:
            also(step, total)

    image = backend.generate(request, on_step, cancelled or threading.Event())
    return image, steps


def decoded(image: RenderedImage) -> Image.Image:
    opened = Image.open(io.BytesIO(image.png))
    opened.load()  # reads every chunk: a truncated or corrupt PNG fails here
    return opened


def test_names_its_library_and_pipeline(backend: DiffusersBackend) -> None:
    assert backend.name == BACKEND_NAME == "diffusers"
    assert backend.pipeline_class == "StableDiffusionPipeline"


@pytest.mark.parametrize(("width", "height"), [(64, 64), (64, 32), (32, 64)])
def test_renders_a_png_of_the_requested_size(
    backend: DiffusersBackend, width: int, height: int
) -> None:
    image, _ = render(backend, replace(APPLE, width=width, height=height))
    png = decoded(image)
    assert isinstance(png, PngImageFile)
    assert png.size == (width, height)
    assert (image.width, image.height) == (width, height)
    assert png.text == {}  # no chunks that could vary between runs


def test_reports_each_step_in_order(backend: DiffusersBackend) -> None:
    _, steps = render(backend, replace(APPLE, steps=3))
    assert steps == [(1, 3), (2, 3), (3, 3)]


def test_reports_the_steps_the_scheduler_runs(tmp_path: Path) -> None:
    from tests.tiny_pipeline import build_tiny_sd_pipeline

    directory = build_tiny_sd_pipeline(tmp_path / "pndm", scheduler="pndm")
    backend = DiffusersBackend(directory, OPTIONS)
    try:
        _, steps = render(backend, replace(APPLE, steps=3))
    finally:
        backend.close()
    # PNDM repeats one timestep to start its multistep method: 3 asked, 4 run.
    assert steps == [(1, 4), (2, 4), (3, 4), (4, 4)]


def test_the_same_seed_gives_the_same_bytes(backend: DiffusersBackend) -> None:
    first, _ = render(backend, APPLE)
    second, _ = render(backend, APPLE)
    assert first.png == second.png


def test_pins_torch_threads_again_for_each_request(backend: DiffusersBackend) -> None:
    import torch

    reference, _ = render(backend, APPLE)
    seen: list[int] = []
    torch.set_num_threads(2)  # as another model's worker might
    try:
        image, _ = render(backend, APPLE, also=lambda *_: seen.append(torch.get_num_threads()))
    finally:
        torch.set_num_threads(OPTIONS.threads)
    assert set(seen) == {OPTIONS.threads}
    assert image.png == reference.png


@pytest.mark.parametrize(
    "change",
    [
        {"seed": 8},
        {"prompt": "the apple and the table"},
        {"negative_prompt": "blue"},
        {"guidance": 1.0},  # at 1 the pipeline skips the unconditioned pass
    ],
    ids=["seed", "prompt", "negative_prompt", "guidance"],
)
def test_each_request_field_changes_the_image(
    backend: DiffusersBackend, change: dict[str, object]
) -> None:
    reference, _ = render(backend, APPLE)
    changed, _ = render(backend, replace(APPLE, **change))  # type: ignore[arg-type]
    assert changed.png != reference.png


def test_unset_size_is_the_default_size(backend: DiffusersBackend) -> None:
    assert backend.default_size() == (64, 64)  # the UNet's 32 latents, times the VAE's 2
    image, _ = render(backend, replace(APPLE, width=None, height=None))
    assert decoded(image).size == backend.default_size()


def test_one_side_set_keeps_it_and_defaults_the_other(backend: DiffusersBackend) -> None:
    image, _ = render(backend, replace(APPLE, width=32, height=None))
    assert decoded(image).size == (32, 64)
    image, _ = render(backend, replace(APPLE, width=None, height=32))
    assert decoded(image).size == (64, 32)


def test_cancelling_stops_after_the_current_step(backend: DiffusersBackend) -> None:
    five_steps = replace(APPLE, steps=5)
    reference, _ = render(backend, five_steps)
    cancelled = threading.Event()
    steps: Steps = []

    def on_step(step: int, total: int) -> None:
        steps.append((step, total))
        cancelled.set()  # the client goes away during the first step

    with pytest.raises(GenerationCancelled):
        backend.generate(five_steps, on_step, cancelled)
    assert steps == [(1, 5)]
    # The pipeline is left as it was: the next request renders what it did before.
    after, after_steps = render(backend, five_steps)
    assert after_steps == [(step, 5) for step in range(1, 6)]
    assert after.png == reference.png


@pytest.mark.parametrize("component", ["unet", "vae"])
def test_cancelling_stops_inside_a_step_or_the_decode(
    backend: DiffusersBackend, component: str
) -> None:
    """On a CPU one step (or the VAE decode) of a large image takes minutes: the
    cancel is seen as the next layer starts, not at the step's end (issue 38)."""
    reference, _ = render(backend, APPLE)
    pipeline = backend._pipeline
    assert pipeline is not None
    model = getattr(pipeline, component)
    middle = model.mid_block if component == "unet" else model.decoder.mid_block
    last = model.conv_out if component == "unet" else model.decoder.conv_out
    cancelled = threading.Event()
    ran_last: list[bool] = []
    handles = [
        middle.register_forward_hook(lambda *_: cancelled.set()),  # the client leaves here
        last.register_forward_hook(lambda *_: ran_last.append(True)),
    ]
    try:
        with pytest.raises(GenerationCancelled):
            _, steps = render(backend, APPLE, cancelled)
    finally:
        for handle in handles:
            handle.remove()
    assert ran_last == []  # the layers after the middle one never ran
    after, steps = render(backend, APPLE)
    assert steps == [(1, 2), (2, 2)]
    assert after.png == reference.png  # the pipeline is left as it was


def test_a_request_cancelled_before_it_starts_runs_no_step(backend: DiffusersBackend) -> None:
    cancelled = threading.Event()
    cancelled.set()
    steps: Steps = []
    with pytest.raises(GenerationCancelled):
        backend.generate(APPLE, lambda *step: steps.append(step), cancelled)
    assert steps == []


def test_a_size_the_pipeline_refuses_is_not_supported(backend: DiffusersBackend) -> None:
    with pytest.raises(NotSupported, match="divisible by 8"):
        render(backend, replace(APPLE, width=60))


def test_close_is_idempotent_and_final(pipeline_dir: Path) -> None:
    backend = DiffusersBackend(pipeline_dir, OPTIONS)
    backend.close()
    backend.close()
    with pytest.raises(BackendFailure, match="closed"):
        render(backend, APPLE)


def _truncate(file: Path) -> None:
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])


def _not_a_pipeline(directory: Path) -> None:
    (directory / "model_index.json").unlink()


def _unknown_pipeline(directory: Path) -> None:
    index = json.loads((directory / "model_index.json").read_text())
    index["_class_name"] = "NoSuchPipeline"
    (directory / "model_index.json").write_text(json.dumps(index))


@pytest.mark.parametrize(
    "breakage",
    [
        _not_a_pipeline,
        _unknown_pipeline,
        lambda directory: _truncate(directory / "unet" / "diffusion_pytorch_model.safetensors"),
        lambda directory: _truncate(directory / "text_encoder" / "model.safetensors"),
        lambda directory: shutil.rmtree(directory / "tokenizer"),
    ],
    ids=[
        "no-model-index",
        "unknown-pipeline",
        "truncated-unet",
        "truncated-text-encoder",
        "no-tokenizer",
    ],
)
def test_a_broken_directory_fails_to_load(
    pipeline_dir: Path, tmp_path: Path, breakage: Callable[[Path], None]
) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(pipeline_dir, broken)
    breakage(broken)
    with pytest.raises(NotSupported, match="diffusers cannot load broken: ") as failure:
        DiffusersBackend(broken, OPTIONS)
    assert str(tmp_path) not in failure.value.message  # the server's paths stay private


def test_a_missing_directory_fails_to_load(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(NotSupported, match="cannot load nowhere: it is not a directory"):
        DiffusersBackend(missing, OPTIONS)


def test_a_device_torch_cannot_use_fails_to_load(pipeline_dir: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    with pytest.raises(BackendFailure, match="no CUDA GPU"):
        DiffusersBackend(pipeline_dir, DiffusersOptions(threads=2, device="cuda"))


def test_importing_the_module_imports_neither_torch_nor_diffusers() -> None:
    probe = (
        "import sys, service.backends.diffusers_pipeline; "
        "print(sorted({'torch', 'diffusers', 'transformers', 'PIL'} & set(sys.modules)))"
    )
    found = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=Path(__file__).parent.parent,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert found.strip() == "[]"
