"""What an image backend provides; it runs on the worker thread that owns its model."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol

from service.images.requests import ImageRequest, RenderedImage

# Called after each denoising step with (step, total_steps), steps counted from 1.
ProgressCallback = Callable[[int, int], None]


class GenerationCancelled(Exception):
    """Raised inside a backend when the request's `cancelled` event is set."""


class ImageBackend(Protocol):
    @property
    def name(self) -> str:
        """The library or tool, as clients see it: "diffusers", "mflux"."""
        ...

    def generate(
        self, request: ImageRequest, on_step: ProgressCallback, cancelled: threading.Event
    ) -> RenderedImage:
        """Render one image; raise GenerationCancelled soon after `cancelled` is set."""
        ...

    def close(self) -> None: ...
