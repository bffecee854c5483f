"""The diffusers backend: a diffusers pipeline directory, run in process.

torch and diffusers are imported when a pipeline is loaded, not with this
module: together they take seconds to import, and the server starts without them.
"""

from __future__ import annotations

import gc
import importlib.util
import inspect
import io
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from service.backends.failure import load_refused
from service.backends.names import DIFFUSERS
from service.errors import BackendFailure, NotSupported
from service.images.backend import GenerationCancelled, ProgressCallback
from service.images.requests import ImageRequest, RenderedImage

# DiffusionPipeline from its own module: through diffusers' top level, mypy sees
# the placeholder class that stands in when torch is missing.
if TYPE_CHECKING:
    import torch
    from diffusers.pipelines.pipeline_utils import DiffusionPipeline
    from PIL.Image import Image

BACKEND_NAME = DIFFUSERS

# What diffusers and transformers raise for a missing or malformed model_index.json,
# an unknown pipeline or component class, a config that does not fit its weights, or a
# truncated weights file (diffusers says OSError; transformers lets SafetensorError out).
_LOAD_ERRORS = (OSError, ValueError, KeyError, TypeError, AttributeError, ImportError, RuntimeError)

# The request fields a pipeline takes as keyword arguments, as clients name them.
_FIELD_NAMES = {
    "negative_prompt": "a negative prompt",
    "width": "a width",
    "height": "a height",
    "num_inference_steps": "a number of steps",
    "guidance_scale": "a guidance scale",
}


@dataclass(frozen=True)
class DiffusersOptions:
    # torch's intra-op threads, pinned: a different count sums in a different
    # order, and the same seed would no longer give the same bytes.
    threads: int
    device: str | None = None  # None: "cuda" when torch sees a GPU, else "cpu"


class DiffusersBackend:
    """One diffusers pipeline directory, loaded in process. Not thread-safe: one worker owns it."""

    def __init__(self, path: Path, options: DiffusersOptions) -> None:
        import torch

        self._threads = options.threads
        torch.set_num_threads(self._threads)
        self._device = _resolve_device(options.device)
        self._pipeline: DiffusionPipeline | None = _load(path, self._device)
        self._pipeline_class = type(self._pipeline).__name__
        self._parameters = frozenset(inspect.signature(self._pipeline.__call__).parameters)
        if "callback_on_step_end" not in self._parameters:
            self.close()
            raise load_refused(
                "diffusers",
                path,
                f"{self._pipeline_class} reports no steps (it takes no `callback_on_step_end`), "
                "so it can be neither followed nor cancelled",
            )
        self._default_size = _default_size(self._pipeline)
        # The request rendering now: checked as each layer starts (see _stop_inside).
        self._cancelled: threading.Event | None = None
        _stop_inside(self._pipeline, self._check_cancelled)

    @property
    def name(self) -> str:
        return BACKEND_NAME

    @property
    def pipeline_class(self) -> str:
        return self._pipeline_class

    def default_size(self) -> tuple[int, int]:
        """The (width, height) the pipeline makes when the request sets neither."""
        if self._default_size is None:
            raise NotSupported(
                f"{self._pipeline_class} states no default image size; set width and height"
            )
        return self._default_size

    def generate(
        self, request: ImageRequest, on_step: ProgressCallback, cancelled: threading.Event
    ) -> RenderedImage:
        import torch

        pipeline = self._live_pipeline()
        if cancelled.is_set():
            raise GenerationCancelled
        # Process-global: another model's worker may have changed it since the load.
        torch.set_num_threads(self._threads)
        generator = torch.Generator(self._device).manual_seed(request.seed)
        arguments = self._call_arguments(request, generator, _step_reporter(on_step, cancelled))
        self._cancelled = cancelled
        try:
            with torch.inference_mode():
                image = _run(pipeline, arguments)
        finally:
            self._cancelled = None
        if cancelled.is_set():  # set while the last step was decoded: the client has gone
            raise GenerationCancelled
        return RenderedImage(png=_encode_png(image), width=image.width, height=image.height)

    def close(self) -> None:
        if self._pipeline is None:
            return
        self._pipeline = None
        # Modules can sit in reference cycles; free them now, not at some later collection.
        gc.collect()
        if _is_cuda(self._device):
            import torch

            # Hand the freed blocks back to the driver, for the next model to load.
            torch.cuda.empty_cache()

    def _check_cancelled(self, module: torch.nn.Module, inputs: Any) -> None:
        cancelled = self._cancelled
        if cancelled is not None and cancelled.is_set():
            raise GenerationCancelled

    def _call_arguments(
        self, request: ImageRequest, generator: torch.Generator, callback: _StepCallback
    ) -> dict[str, Any]:
        arguments: dict[str, Any] = {}
        if request.negative_prompt:
            arguments["negative_prompt"] = request.negative_prompt
        arguments.update(self._size_arguments(request))
        if request.steps is not None:
            arguments["num_inference_steps"] = request.steps
        if request.guidance is not None:
            arguments["guidance_scale"] = request.guidance
        for name in arguments:
            if name not in self._parameters:
                raise NotSupported(f"{self._pipeline_class} does not take {_FIELD_NAMES[name]}")
        return {
            "prompt": request.prompt,
            "generator": generator,
            "callback_on_step_end": callback,
            "output_type": "pil",
            **arguments,
        }

    def _size_arguments(self, request: ImageRequest) -> dict[str, int]:
        if request.width is None and request.height is None:
            return {}  # the pipeline's own default, whether or not we can read it
        if request.width is not None and request.height is not None:
            return {"width": request.width, "height": request.height}
        # Given one side alone, pipelines drop it and make their default size; fill in the other.
        default_width, default_height = self.default_size()
        return {"width": request.width or default_width, "height": request.height or default_height}

    def _live_pipeline(self) -> DiffusionPipeline:
        if self._pipeline is None:
            raise BackendFailure("this diffusers pipeline was closed")
        return self._pipeline


# diffusers calls it as callback(pipeline, step_index, timestep, tensors) -> tensors to replace.
_StepCallback = Callable[[Any, int, Any, dict[str, Any]], dict[str, Any]]


def _step_reporter(on_step: ProgressCallback, cancelled: threading.Event) -> _StepCallback:
    def step_ended(
        pipeline: Any, index: int, timestep: Any, tensors: dict[str, Any]
    ) -> dict[str, Any]:
        on_step(index + 1, _steps_running(pipeline))
        if cancelled.is_set():
            # Raised inside the denoising loop, it leaves at once: no more steps, no
            # VAE decode. The next call sets the scheduler's timesteps afresh.
            raise GenerationCancelled
        return {}  # replace none of the pipeline's tensors

    return step_ended


def _stop_inside(pipeline: DiffusionPipeline, check: Callable[[Any, Any], None]) -> None:
    """Have every layer of every component call `check` before it runs.

    Between steps is not often enough: on a CPU one step of a large image takes
    minutes (a 1024x1024 one on a tiny pipeline, one attention ~90 s), and the
    VAE decode runs after the last step. A layer starting is the finest point
    Python sees; one native call cannot be stopped from inside, and the front
    stops an engine that goes on too long after a cancel (--image-cancel-seconds).
    A hook that raises leaves the modules as they were: they keep no state
    between calls, and the next call sets the scheduler's timesteps afresh.
    """
    import torch

    for component in pipeline.components.values():
        if isinstance(component, torch.nn.Module):
            for module in component.modules():
                module.register_forward_pre_hook(check)


def _steps_running(pipeline: Any) -> int:
    """How many steps this call runs: not always those asked for (PNDM adds one)."""
    counted = getattr(pipeline, "_num_timesteps", None)  # set by the pipeline before its loop
    if isinstance(counted, int) and counted > 0:
        return counted
    return len(pipeline.scheduler.timesteps)


def _run(pipeline: DiffusionPipeline, arguments: dict[str, Any]) -> Image:
    from PIL.Image import Image

    call: Callable[..., Any] = pipeline.__call__
    try:
        output = call(**arguments)
    except ValueError as exc:  # how pipelines refuse inputs they cannot take
        raise NotSupported(f"diffusers cannot do this request: {exc}") from exc
    image = output.images[0]
    if not isinstance(image, Image):
        raise BackendFailure(f"diffusers returned a {type(image).__name__}, not an image")
    return image


def _encode_png(image: Image) -> bytes:
    # Pillow writes no time or text chunks unless asked: the same pixels give the same bytes.
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _resolve_device(requested: str | None) -> str:
    import torch

    if requested is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        kind = torch.device(requested).type
    except RuntimeError as exc:  # torch's word for a device string it cannot parse
        raise BackendFailure(f"diffusers cannot use device {requested!r}: {exc}") from exc
    if kind == "cuda" and not torch.cuda.is_available():
        # Else moving the pipeline fails with a bare AssertionError from torch.
        raise BackendFailure(f"diffusers cannot use device {requested!r}: torch sees no CUDA GPU")
    return requested


def _is_cuda(device: str) -> bool:
    return device.split(":", 1)[0] == "cuda"


def _load(path: Path, device: str) -> DiffusionPipeline:
    if not path.is_dir():
        # from_pretrained takes a path that does not exist for a Hub repo id.
        raise load_refused("diffusers", path, "it is not a directory")
    import torch
    from diffusers.pipelines.pipeline_utils import DiffusionPipeline
    from safetensors import SafetensorError

    missing = _missing_components(path)
    if missing:
        raise load_refused("diffusers", path, f"it has no {', '.join(missing)}/")
    _quiet_progress_bars()
    try:
        pipeline = DiffusionPipeline.from_pretrained(
            path,
            local_files_only=True,
            # True refuses pickled weights beside the safetensors; None allows them.
            use_safetensors=True if _has_safetensors(path) else None,
            # Half precision on a GPU, as pipelines are published; a CPU computes float32.
            dtype=torch.float16 if _is_cuda(device) else torch.float32,
            # diffusers asks for accelerate here and logs a warning when it is missing.
            low_cpu_mem_usage=importlib.util.find_spec("accelerate") is not None,
        )
        pipeline.to(device)
    except (*_LOAD_ERRORS, SafetensorError) as exc:
        raise load_refused("diffusers", path, str(exc)) from exc
    pipeline.set_progress_bar_config(disable=True)  # type: ignore[no-untyped-call]
    return pipeline


def _missing_components(path: Path) -> list[str]:
    """The component folders model_index.json names that are not there.

    transformers builds a tokenizer with an empty vocabulary from a folder that
    does not exist, so such a pipeline would load and then draw from nothing.
    """
    try:
        index = json.loads((path / "model_index.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return []  # from_pretrained says what is wrong with it
    if not isinstance(index, dict):
        return []
    return [
        name
        for name, value in index.items()
        if isinstance(value, list) and value[:1] != [None] and not (path / name).is_dir()
    ]


def _has_safetensors(path: Path) -> bool:
    return any(path.glob("*.safetensors")) or any(path.glob("*/*.safetensors"))


def _quiet_progress_bars() -> None:
    """Loading draws tqdm bars on stderr, where our JSON log lines go."""
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    diffusers_logging.disable_progress_bar()
    transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]


def _default_size(pipeline: DiffusionPipeline) -> tuple[int, int] | None:
    """(width, height), as the pipelines compute it: latent sample size times the VAE's scale."""
    scale = getattr(pipeline, "vae_scale_factor", None)
    sample = getattr(pipeline, "default_sample_size", None)  # SDXL, SD3, Flux
    if sample is None:  # Stable Diffusion 1.x and 2.x read their UNet's config
        denoiser = getattr(pipeline, "unet", None) or getattr(pipeline, "transformer", None)
        sample = getattr(getattr(denoiser, "config", None), "sample_size", None)
    if not isinstance(scale, int):
        return None
    if isinstance(sample, int):
        return sample * scale, sample * scale
    if isinstance(sample, list | tuple) and len(sample) == 2:
        height, width = sample  # a UNet's sample_size is (height, width)
        return int(width) * scale, int(height) * scale
    return None
