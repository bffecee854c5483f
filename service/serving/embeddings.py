"""Serving one Embed request: the model from the pool, the vectors from its engine.

The engine evaluates every request waiting for it together (service.embeddings.
batcher); here a request only takes its model, as Generate does.
"""

from __future__ import annotations

from service.admission import Capability
from service.embeddings.requests import Embedded, EmbedRequest
from service.models.pool import ModelPool


class EmbeddingService:
    def __init__(self, pool: ModelPool) -> None:
        self._pool = pool

    async def embed(self, request: EmbedRequest) -> tuple[Embedded, str]:
        """The vectors, and the backend that made them."""
        async with self._pool.use(request.model, Capability.EMBED) as model:
            engine = model.require(Capability.EMBED)
            return await engine.embed(request), engine.info.backend
