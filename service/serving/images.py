"""Serving one GenerateImage request: route it by model, stream progress, return the PNG.

The model decides the backend, never a switch: a model the operator mapped to
the external command, or one of that command's built-in names, runs there;
anything else is resolved like a text model and must be a diffusers pipeline,
which runs in its engine, from the shared pool.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import AsyncGenerator
from contextlib import aclosing
from pathlib import Path

import structlog

from service.admission import Capability, Decision
from service.backends.names import EXTERNAL as EXTERNAL_SETTING
from service.config import ImageSettings
from service.errors import NotSupported, Overloaded
from service.images.external import BACKEND_NAME as EXTERNAL
from service.images.external import CommandResolver, ExternalRoute, run_external
from service.images.requests import ImageDone, ImageEvent, ImageRequest, ImageStep, RenderedImage
from service.memory import format_bytes
from service.models.pool import LoadedModel, ModelPool

log = structlog.get_logger("images")

# What a route yields: progress, then the image and the backend that made it.
_Rendered = tuple[RenderedImage, str]


class ImageGenerator:
    def __init__(self, pool: ModelPool, settings: ImageSettings, commands: CommandResolver) -> None:
        self._pool = pool
        self._settings = settings
        self._commands = commands

    async def route(self, model: str) -> ExternalRoute | None:
        """The external route for `model`, or None when it runs in process."""
        spec = self._pool.catalog.configured(model)
        if spec is not None and spec.backend != EXTERNAL_SETTING:
            return None
        builtins = await asyncio.to_thread(self._commands.known_base_models)
        if spec is not None:
            if spec.source in builtins:
                return ExternalRoute(spec.name, spec.source)
            return ExternalRoute(spec.name, spec.base_model, spec.source)
        return ExternalRoute(model, model) if model in builtins else None

    async def external_decision(self, route: ExternalRoute) -> Decision:
        command = await asyncio.to_thread(self._commands.resolve)
        if command is None:
            return Decision(False, self._commands.missing_reason(), EXTERNAL)
        served = route.repo or route.base_model
        return Decision(True, f"{Path(command.executable).name} serves {served}", EXTERNAL)

    async def generate(
        self, request: ImageRequest, received_at: float | None = None
    ) -> AsyncGenerator[ImageEvent, None]:
        """Progress, then the image; times count from `received_at` (time.monotonic),
        when the request reached the server, taken by the caller. None: now."""
        started = time.monotonic() if received_at is None else received_at
        route = await self.route(request.model)
        if route is None:
            events = self._in_process(request, started)
        else:
            events = self._external(route, request, started)
        async with aclosing(events):
            async for event in events:
                if isinstance(event, ImageStep):
                    yield event
                    continue
                image, backend = event
                await asyncio.to_thread(self._save, image, request)  # a disk write
                total_ms = (time.monotonic() - started) * 1000
                yield ImageDone(image, request.seed, request.model, backend, total_ms)

    async def _external(
        self, route: ExternalRoute, request: ImageRequest, started: float
    ) -> AsyncGenerator[ImageStep | _Rendered, None]:
        command = await asyncio.to_thread(self._commands.resolve)
        if command is None:
            raise NotSupported(self._commands.missing_reason())
        timeout = self._settings.image_command_timeout
        async with aclosing(run_external(command, route, request, timeout, started)) as events:
            async for event in events:
                yield event if isinstance(event, ImageStep) else (event, EXTERNAL)

    async def _in_process(
        self, request: ImageRequest, started: float
    ) -> AsyncGenerator[ImageStep | _Rendered, None]:
        need, what = self._working_memory(request)
        self._check_size(request, need, None)  # before the model is loaded for nothing
        async with self._pool.use(request.model, Capability.IMAGE) as model:
            engine = model.require(Capability.IMAGE)
            self._check_size(request, need, model)
            rendering = engine.generate_image(request, started)
            async with self._pool.working_memory(need, what), aclosing(rendering):
                async for item in rendering:
                    yield (item, engine.info.backend) if isinstance(item, RenderedImage) else item

    def _working_memory(self, request: ImageRequest) -> tuple[int, str]:
        """What rendering takes beyond the weights, from the resolution: the activations
        grow with the pixels (an unset side is taken as 1024, the largest default)."""
        width, height = request.width or 1024, request.height or 1024
        need = width * height * self._settings.image_bytes_per_pixel
        return need, f"{request.model} (a {width}x{height} image)"

    def _check_size(self, request: ImageRequest, need: int, beside: LoadedModel | None) -> None:
        """RESOURCE_EXHAUSTED, naming the largest size that fits, when the image's working
        memory cannot fit the budget beside its model however long it waits. (One that
        fits once busy models finish waits for them, as a load does.)"""
        budget = self._pool.limits.budget_bytes
        held = 0 if beside is None else beside.memory_bytes
        if need <= budget - held:
            return
        width, height = request.width or 1024, request.height or 1024
        per_pixel = self._settings.image_bytes_per_pixel
        fit = largest_fitting(width, height, max(0, budget - held) // per_pixel)
        where = f" beside model {request.model!r} (it holds {format_bytes(held)})" if beside else ""
        advice = "no image fits; raise --memory-budget"
        if fit is not None:
            advice = (
                f"at most {fit[0]}x{fit[1]} fits at this shape: ask for that or smaller, or "
                "raise --memory-budget"
            )
        raise Overloaded(
            f"a {width}x{height} image needs about {format_bytes(need)} of working memory "
            f"({per_pixel} bytes a pixel, --image-bytes-per-pixel), more than the memory "
            f"budget of {format_bytes(budget)} holds{where}; {advice}"
        )

    def _save(self, image: RenderedImage, request: ImageRequest) -> None:
        """Keep a copy under --image-output-dir, if set. Blocking: run it off the loop."""
        directory = self._settings.image_output_dir
        if directory is None:
            return
        name = f"{time.strftime('%Y%m%d-%H%M%S')}-{request.seed}-{uuid.uuid4().hex[:8]}.png"
        try:
            directory.mkdir(parents=True, exist_ok=True)
            (directory / name).write_bytes(image.png)
        except OSError as exc:  # the image still reaches the client
            log.warning("could not save image", path=str(directory / name), error=str(exc))


def largest_fitting(width: int, height: int, pixels: int) -> tuple[int, int] | None:
    """The largest (width, height) of the same shape, in multiples of 8, with at most
    `pixels` pixels; None when not even 8x8 has so few."""
    scale = math.sqrt(pixels / (width * height))
    fit = (int(width * scale) // 8 * 8, int(height * scale) // 8 * 8)
    return fit if min(fit) >= 8 else None
