"""A diffusers pipeline served end to end: admission, the shared pool, progress, the PNG."""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import grpc
import pytest
from PIL import Image

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from service.backends.diffusers_pipeline import DiffusersBackend
from service.engine.local import LocalEngine
from service.models.pool import LoadedModel, ModelPool
from tests.conftest import GEMMA, RunningServer, collect, make_settings, serving

if TYPE_CHECKING:
    import torch


@pytest.fixture(scope="module")
def image_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.tiny_pipeline import build_tiny_sd_pipeline  # torch: imported where needed

    models = tmp_path_factory.mktemp("image-models")
    build_tiny_sd_pipeline(models / "tiny-sd")
    return models


@pytest.fixture(scope="module")
def image_server(image_models: Path) -> Iterator[tuple[RunningServer, pb_grpc.InferenceStub]]:
    with serving(make_settings(models_dir=[image_models], image_max_steps=10)) as running:
        yield running


@pytest.fixture(scope="module")
def stub(image_server: tuple[RunningServer, pb_grpc.InferenceStub]) -> pb_grpc.InferenceStub:
    return image_server[1]


def render(stub: pb_grpc.InferenceStub, **fields: Any) -> list[pb.GenerateImageResponse]:
    values: dict[str, Any] = {"prompt": "a red apple", "width": 64, "height": 32, "steps": 3}
    values.update(fields)
    return list(stub.GenerateImage(pb.GenerateImageRequest(model="tiny-sd", **values)))


def test_admit_routes_a_pipeline_directory_to_diffusers(stub: pb_grpc.InferenceStub) -> None:
    reply = stub.Admit(pb.AdmitRequest(model="tiny-sd", capability=pb.CAPABILITY_IMAGE))
    assert reply.admitted, reply.reason
    assert (reply.backend, reply.architecture) == ("diffusers", "StableDiffusionPipeline")
    assert reply.memory.weights_bytes > 0
    assert reply.quantization.method == "float32"


def test_progress_then_a_png_of_the_requested_size(stub: pb_grpc.InferenceStub) -> None:
    events = render(stub, seed=5)
    steps = [(e.progress.step, e.progress.total_steps) for e in events[:-1]]
    assert steps == [(1, 3), (2, 3), (3, 3)]
    elapsed = [e.progress.elapsed_ms for e in events[:-1]]
    assert elapsed == sorted(elapsed)
    image = events[-1].image
    assert (image.width, image.height, image.seed) == (64, 32, 5)
    assert (image.model, image.backend, image.media_type) == ("tiny-sd", "diffusers", "image/png")
    with Image.open(io.BytesIO(image.data)) as png:
        assert (png.format, png.size) == ("PNG", (64, 32))


def test_the_same_seed_gives_the_same_bytes(stub: pb_grpc.InferenceStub) -> None:
    first = render(stub, seed=11)[-1].image.data
    assert render(stub, seed=11)[-1].image.data == first
    assert render(stub, seed=12)[-1].image.data != first
    assert render(stub, seed=11, prompt="a green pear")[-1].image.data != first


def test_an_unset_seed_is_drawn_and_reported(stub: pb_grpc.InferenceStub) -> None:
    request = pb.GenerateImageRequest(model="tiny-sd", prompt="a cat", steps=1)
    image = list(stub.GenerateImage(request))[-1].image
    request.seed = image.seed
    assert list(stub.GenerateImage(request))[-1].image.data == image.data


def test_each_capability_refuses_the_other_kind_of_model(stub: pb_grpc.InferenceStub) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        collect(stub.Generate(pb.GenerateRequest(model="tiny-sd", prompt="hi")))
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "GenerateImage" in (caught.value.details() or "")
    with pytest.raises(grpc.RpcError) as caught:
        list(stub.GenerateImage(pb.GenerateImageRequest(model=GEMMA, prompt="a cat")))
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "text model" in (caught.value.details() or "")


def test_the_pipeline_lives_in_the_shared_pool(stub: pb_grpc.InferenceStub) -> None:
    render(stub)
    models = {m.name: m for m in stub.ListModels(pb.ListModelsRequest()).models}
    pipeline = models["tiny-sd"]
    assert pipeline.loaded
    assert (pipeline.backend, list(pipeline.capabilities)) == ("diffusers", [pb.CAPABILITY_IMAGE])
    assert pipeline.memory_bytes > 0


def test_limits_are_checked_before_the_model(stub: pb_grpc.InferenceStub) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        render(stub, steps=11)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "[1, 10]" in (caught.value.details() or "")


def test_cancelling_mid_denoise_leaves_the_pipeline_usable(stub: pb_grpc.InferenceStub) -> None:
    call = stub.GenerateImage(
        pb.GenerateImageRequest(model="tiny-sd", prompt="a cat", steps=10, seed=1)
    )
    assert next(call).progress.step == 1
    call.cancel()
    with pytest.raises(grpc.RpcError) as caught:
        list(call)
    assert caught.value.code() == grpc.StatusCode.CANCELLED
    events = render(stub, seed=1, steps=2)
    assert events[-1].image.width == 64
    assert stub.Admit(pb.AdmitRequest(model="tiny-sd", capability=pb.CAPABILITY_IMAGE)).loaded


def test_a_pipeline_that_fails_mid_denoise_is_discarded_and_reloaded(image_models: Path) -> None:
    # In process, so that the test can reach into the pipeline; an engine
    # process runs the same code (service.engine.core).
    settings = make_settings(models_dir=[image_models], engine_mode="in-process")
    with serving(settings) as (running, stub):
        pool = running.server.pool
        render(stub)
        loads = pool.stats.loads["tiny-sd"]
        (broken,) = [m for m in pool.loaded() if m.name == "tiny-sd"]
        backend = cast(LocalEngine, broken.engine).core.backend
        pipeline = cast(DiffusersBackend, backend)._pipeline
        assert pipeline is not None
        _fail_mid_denoise(pipeline, stub, broken, pool, loads)


def _fail_mid_denoise(
    pipeline: Any, stub: pb_grpc.InferenceStub, broken: LoadedModel, pool: ModelPool, loads: int
) -> None:
    def failing(module: torch.nn.Module, inputs: Any) -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    # torch itself raises, inside the pipeline's UNet, as a failing device would.
    pipeline.unet.register_forward_pre_hook(failing)
    with pytest.raises(grpc.RpcError) as caught:
        render(stub)
    assert caught.value.code() == grpc.StatusCode.INTERNAL
    details = caught.value.details() or ""
    assert "failed while generating" in details
    assert "illegal memory access" in details
    assert "loads it afresh" in details
    assert broken.broken
    assert render(stub, seed=3)[-1].image.width == 64
    assert pool.stats.loads["tiny-sd"] == loads + 1
    (fresh,) = [m for m in pool.loaded() if m.name == "tiny-sd"]
    assert fresh is not broken


def test_an_image_reserves_its_working_memory_before_it_starts(image_models: Path) -> None:
    """The activations grow with the pixels: a request whose estimate cannot fit the
    budget beside its model is refused before a step runs (issue 27: a 2048x2048 image
    took 4.1 GB while the pool counted 8.6 MB), naming the size that fits (issue 38)."""
    settings = make_settings(models_dir=[image_models], memory_budget="1GiB")
    with serving(settings) as (running, stub):
        pool = running.server.pool
        with pytest.raises(grpc.RpcError) as caught:
            render(stub, width=2048, height=1024, steps=2)
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        details = str(caught.value.details())
        assert "a 2048x1024 image" in details
        # 1 GiB at 4 KiB a pixel: 262,144 pixels, 724x362 at this shape, in multiples of 8.
        assert "at most 720x360 fits" in details
        assert "tiny-sd" not in pool.stats.loads  # refused before the model was loaded
        events = render(stub, width=128, height=128, steps=2)  # 64 MiB: it fits
        assert events[-1].image.width == 128
        assert pool.used_bytes() == sum(m.memory_bytes for m in pool.loaded())  # nothing held
        (model,) = [m for m in pool.loaded() if m.name == "tiny-sd"]
        _refused_beside(stub, model.memory_bytes, pool.limits.budget_bytes)


def _refused_beside(stub: pb_grpc.InferenceStub, held: int, budget: int) -> None:
    """512x512 takes the whole budget: it cannot fit beside its loaded model, however
    long it waits (before, it waited --load-wait for its own model to go idle)."""
    with pytest.raises(grpc.RpcError) as caught:
        render(stub, width=512, height=512, steps=2)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    details = str(caught.value.details())
    assert "beside model 'tiny-sd'" in details
    fits = re.search(r"at most (\d+)x(\d+) fits", details)
    assert fits is not None, details
    width, height = int(fits[1]), int(fits[2])
    assert width == height  # the shape asked for
    assert width % 8 == 0
    assert width * height * 4096 <= budget - held < (width + 8) * (height + 8) * 4096


def test_list_models_counts_what_an_image_engine_holds(
    image_server: tuple[RunningServer, pb_grpc.InferenceStub],
) -> None:
    """The weights are a few MiB; torch and the pipeline's buffers hold far more. The pool
    counts what the engine process holds, measured when idle (issue 38: listed at 6 MiB
    while its engine held 1.1 GB)."""
    running, stub = image_server
    render(stub)
    weights = stub.Admit(pb.AdmitRequest(model="tiny-sd", capability=pb.CAPABILITY_IMAGE))
    models = {m.name: m for m in stub.ListModels(pb.ListModelsRequest()).models}
    listed = models["tiny-sd"]
    assert listed.rss_bytes > 10 * weights.memory.weights_bytes  # torch's own, mostly
    assert listed.memory_bytes >= 0.8 * listed.rss_bytes
    (model,) = [m for m in running.server.pool.loaded() if m.name == "tiny-sd"]
    assert model.memory_bytes == listed.memory_bytes  # what the budget counts
