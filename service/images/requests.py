"""What an image request asks for and what its stream reports."""

from __future__ import annotations

import random
from dataclasses import dataclass

from inference.v1 import inference_pb2 as pb
from service.errors import InvalidRequest

SIZE_MULTIPLE = 8
# Image prompts: CLIP reads 77 tokens, T5 encoders a few hundred; far past both.
MAX_PROMPT_CHARS = 8 * 1024
# Classifier-free guidance: pipelines use 1-20; past this, or not finite, is no image.
MAX_GUIDANCE = 50.0


@dataclass(frozen=True)
class ImageLimits:
    max_width: int
    max_height: int
    max_steps: int


@dataclass(frozen=True)
class ImageRequest:
    """A validated request; unset fields mean the model's defaults, the seed is always set."""

    model: str
    prompt: str
    negative_prompt: str
    width: int | None
    height: int | None
    steps: int | None
    guidance: float | None
    seed: int

    @classmethod
    def from_pb(
        cls, msg: pb.GenerateImageRequest, limits: ImageLimits, default_model: str = ""
    ) -> ImageRequest:
        request = cls(
            model=msg.model or default_model,
            prompt=msg.prompt,
            negative_prompt=msg.negative_prompt,
            width=msg.width if msg.HasField("width") else None,
            height=msg.height if msg.HasField("height") else None,
            steps=msg.steps if msg.HasField("steps") else None,
            guidance=msg.guidance if msg.HasField("guidance") else None,
            seed=msg.seed if msg.HasField("seed") else random.randrange(2**32),
        )
        request.validate(limits)
        return request

    def validate(self, limits: ImageLimits) -> None:
        if not self.model:
            raise InvalidRequest(
                "name an image model in `model`: this server has no default image model "
                "(--default-image-model)"
            )
        if not self.prompt.strip():
            raise InvalidRequest("the request needs a non-empty `prompt`")
        for name, text in (("prompt", self.prompt), ("negative_prompt", self.negative_prompt)):
            if len(text) > MAX_PROMPT_CHARS:
                raise InvalidRequest(
                    f"{name} is {len(text)} characters; at most {MAX_PROMPT_CHARS} (the "
                    "text encoders read a few hundred tokens of it)"
                )
        for name, value, limit in (
            ("width", self.width, limits.max_width),
            ("height", self.height, limits.max_height),
        ):
            if value is None:
                continue
            if value < SIZE_MULTIPLE or value % SIZE_MULTIPLE:
                raise InvalidRequest(f"{name} must be a positive multiple of 8, got {value}")
            if value > limit:
                raise InvalidRequest(f"{name} is at most {limit} on this server, got {value}")
        if self.steps is not None and not 1 <= self.steps <= limits.max_steps:
            raise InvalidRequest(f"steps must be in [1, {limits.max_steps}], got {self.steps}")
        if self.guidance is not None and not 0 <= self.guidance <= MAX_GUIDANCE:
            raise InvalidRequest(
                f"guidance must be a number in [0, {MAX_GUIDANCE:g}], got {self.guidance}"
            )


@dataclass(frozen=True)
class RenderedImage:
    """What a backend produced: PNG bytes and their size."""

    png: bytes
    width: int
    height: int


@dataclass(frozen=True)
class ImageStep:
    step: int
    total_steps: int
    elapsed_ms: float

    def to_pb(self) -> pb.GenerateImageResponse:
        return pb.GenerateImageResponse(
            progress=pb.ImageProgress(
                step=self.step, total_steps=self.total_steps, elapsed_ms=self.elapsed_ms
            )
        )


@dataclass(frozen=True)
class ImageDone:
    image: RenderedImage
    seed: int
    model: str
    backend: str
    total_ms: float

    def to_pb(self) -> pb.GenerateImageResponse:
        return pb.GenerateImageResponse(
            image=pb.GeneratedImage(
                data=self.image.png,
                media_type="image/png",
                width=self.image.width,
                height=self.image.height,
                seed=self.seed,
                model=self.model,
                backend=self.backend,
                total_ms=self.total_ms,
            )
        )


ImageEvent = ImageStep | ImageDone
