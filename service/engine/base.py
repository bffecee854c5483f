"""What the front sees of a loaded model's engine, in a process of its own or not."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from inference.v1 import inference_pb2 as pb
from service.embeddings.requests import Embedded, EmbedRequest
from service.errors import Unavailable
from service.images.requests import ImageRequest, ImageStep, RenderedImage
from service.text.requests import GenerationRequest


class EngineCrashed(Unavailable):
    """An engine process died; `cause` says how ("killed by signal SIGSEGV ...")."""

    def __init__(self, message: str, cause: str) -> None:
        super().__init__(message)
        self.cause = cause


def _ignore(why: str) -> None:
    """A hook with nobody to tell."""


@dataclass
class EngineHooks:
    """How an engine tells the pool about its model, called on the event loop."""

    # The model must go: the library failed inside it and left its state unknown, or
    # the front stopped its engine (an image went on too long after its cancel).
    on_failure: Callable[[str], None] = _ignore
    # The engine process died (not asked to): the cause, in words.
    on_exit: Callable[[str], None] = _ignore


@dataclass(frozen=True)
class EngineInfo:
    """What the front needs to know about a loaded model."""

    backend: str
    # 0 for an image model.
    context_length: int
    computes_off_cpu: bool = False


@dataclass(frozen=True)
class MeasuredMemory:
    """What an engine process holds, as the kernel and the GPU driver report it."""

    rss_bytes: int = 0
    gpu_bytes: int = 0


class Engine(Protocol):
    @property
    def info(self) -> EngineInfo: ...

    @property
    def pid(self) -> int | None:
        """The engine process; None when the model runs in the front's own process."""
        ...

    @property
    def running(self) -> int:
        """Generations in the model's batch (a snapshot)."""
        ...

    @property
    def waiting(self) -> int:
        """Generations waiting for a place in the batch (a snapshot)."""
        ...

    def generate(
        self, request: GenerationRequest, received_at: float
    ) -> AsyncGenerator[pb.GenerateResponse, None]:
        """The responses of one generation; stopping early cancels it."""
        ...

    def generate_image(
        self, request: ImageRequest, received_at: float
    ) -> AsyncGenerator[ImageStep | RenderedImage, None]:
        """Progress, then the image; stopping early cancels it."""
        ...

    async def embed(self, request: EmbedRequest) -> Embedded:
        """The vectors of one request's inputs, evaluated with other requests waiting."""
        ...

    async def tokenize(self, request: GenerationRequest) -> pb.TokenizeResponse:
        """The ids `request`'s prompt or messages become, as a generation would feed them."""
        ...

    async def detokenize(self, token_ids: Sequence[int]) -> pb.DetokenizeResponse:
        """The text ids of the model's vocabulary write."""
        ...

    def memory(self) -> MeasuredMemory | None:
        """Measured now; None when not measured apart (an in-process engine)."""
        ...

    async def close(self, reason: str) -> None:
        """End its requests with UNAVAILABLE and `reason`, and free the model."""
        ...
