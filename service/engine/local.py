"""An engine in the front's own process (`--engine-mode in-process`), for debugging
and profiling: a native crash here takes the whole server down."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Sequence
from typing import TypeVar

from inference.v1 import inference_pb2 as pb
from service.embeddings.requests import Embedded, EmbedRequest
from service.engine.base import EngineHooks, EngineInfo, MeasuredMemory
from service.engine.core import EngineCore
from service.engine.loading import load_backend
from service.engine.options import EngineOptions
from service.engine.worker import Channel, ModelWorker
from service.errors import Unavailable
from service.images.requests import ImageRequest, ImageStep, RenderedImage
from service.text.requests import GenerationRequest

T = TypeVar("T")
_Tokens = pb.TokenizeResponse | pb.DetokenizeResponse


async def _only(channel: Channel[T]) -> T:
    """The one item a request is answered by."""
    async for item in channel:
        return item
    raise RuntimeError("the engine ended a request without its answer")


class LocalEngine:
    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self._worker = core.worker

    @classmethod
    async def start(cls, options: EngineOptions, hooks: EngineHooks) -> LocalEngine:
        """Load the model on a worker thread of its own."""
        worker = ModelWorker(options.name)
        try:
            backend = await worker.call(lambda: load_backend(options))
        except BaseException:
            worker.shutdown()
            raise
        loop = asyncio.get_running_loop()

        def failed_from_worker(why: str) -> None:
            with contextlib.suppress(RuntimeError):  # the event loop is gone: shutting down
                loop.call_soon_threadsafe(hooks.on_failure, why)

        return cls(EngineCore(options, backend, worker, on_failure=failed_from_worker))

    @property
    def info(self) -> EngineInfo:
        return self.core.info

    @property
    def pid(self) -> int | None:
        return None

    @property
    def running(self) -> int:
        return self.core.running

    @property
    def waiting(self) -> int:
        return self.core.waiting

    async def generate(
        self, request: GenerationRequest, received_at: float
    ) -> AsyncGenerator[pb.GenerateResponse, None]:
        # With a GPU the loop is woken through the relay thread (see Channel).
        relayed = self.core.info.computes_off_cpu
        channel: Channel[pb.GenerateResponse] = Channel(asyncio.get_running_loop(), relayed)
        self.core.submit_text(request, received_at, channel)
        try:
            async for response in channel:
                yield response
        finally:  # with this generator, not when the channel's own iterator is collected
            channel.cancelled.set()

    async def generate_image(
        self, request: ImageRequest, received_at: float
    ) -> AsyncGenerator[ImageStep | RenderedImage, None]:
        channel: Channel[ImageStep | RenderedImage] = Channel(asyncio.get_running_loop())
        self.core.submit_image(request, received_at, channel)
        try:
            async for item in channel:
                yield item
        finally:
            channel.cancelled.set()

    async def embed(self, request: EmbedRequest) -> Embedded:
        channel: Channel[Embedded] = Channel(asyncio.get_running_loop())
        self.core.submit_embed(request, channel)
        async for embedded in channel:
            return embedded
        raise Unavailable(f"model {self.core.options.name!r} gave no vectors")

    async def tokenize(self, request: GenerationRequest) -> pb.TokenizeResponse:
        channel: Channel[_Tokens] = Channel(asyncio.get_running_loop())
        self.core.submit_tokenize(request, channel)
        answer = await _only(channel)
        assert isinstance(answer, pb.TokenizeResponse)
        return answer

    async def detokenize(self, token_ids: Sequence[int]) -> pb.DetokenizeResponse:
        channel: Channel[_Tokens] = Channel(asyncio.get_running_loop())
        self.core.submit_detokenize(token_ids, channel)
        answer = await _only(channel)
        assert isinstance(answer, pb.DetokenizeResponse)
        return answer

    def memory(self) -> MeasuredMemory | None:
        return None

    async def close(self, reason: str) -> None:
        try:
            await self._worker.call(lambda: self.core.close(reason))
        finally:
            self._worker.shutdown()
