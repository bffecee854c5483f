"""Serving one Generate request: the model from the pool, the generation from its engine.

Everything about the generation itself (chat template, tokenizer, decoding,
tool calls) happens in the model's engine (see `service.engine.core`); this
module holds the model for the length of the stream.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing

from inference.v1 import inference_pb2 as pb
from service.admission import Capability
from service.models.pool import ModelPool
from service.text.requests import GenerationRequest


class TextGenerator:
    def __init__(self, pool: ModelPool) -> None:
        self._pool = pool

    async def generate(
        self,
        request: GenerationRequest,
        received_at: float | None = None,
        report_loading: bool = False,
    ) -> AsyncGenerator[pb.GenerateResponse, None]:
        """The responses of one generation: with `report_loading`, a `loading` event
        first when its model must be loaded; then the engine's.

        `received_at` (time.monotonic) is when the request reached the server: the
        contract measures ttft_ms and queue_ms from there, so the caller takes it
        before converting the request and waiting for a concurrency slot. None: now.
        """
        if received_at is None:
            received_at = time.monotonic()
        if report_loading:
            loading = await self._pool.load_begins(request.model)
            if loading is not None:
                yield pb.GenerateResponse(loading=pb.ModelLoading(model=loading))
        async with self._pool.use(request.model) as model:
            engine = model.require(Capability.TEXT)
            # Closed with this generator, however it ends: the engine hears the cancel now.
            async with aclosing(engine.generate(request, received_at)) as responses:
                async for response in responses:
                    yield response

    async def tokenize(self, request: GenerationRequest) -> pb.TokenizeResponse:
        """The ids `request`'s prompt or messages become in its model."""
        async with self._pool.use(request.model) as model:
            return await model.require(Capability.TEXT).tokenize(request)

    async def detokenize(self, model_name: str, token_ids: Sequence[int]) -> pb.DetokenizeResponse:
        async with self._pool.use(model_name) as model:
            return await model.require(Capability.TEXT).detokenize(token_ids)
