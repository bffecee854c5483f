"""The Inference servicer: a thin adapter from protobuf to the service."""

from __future__ import annotations

from collections.abc import AsyncIterator

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from service.errors import NotImplementedYet
from service.generation import Finished, GenerationRequest, Started
from service.models.pool import ModelPool
from service.rpc import Summary, stream_rpc, unary_rpc
from service.text_generation import TextGenerator


class InferenceServicer(pb_grpc.InferenceServicer):
    def __init__(self, pool: ModelPool, text: TextGenerator) -> None:
        self._pool = pool
        self._text = text

    @stream_rpc
    async def Generate(
        self, request: pb.GenerateRequest, summary: Summary
    ) -> AsyncIterator[pb.GenerateResponse]:
        generation = GenerationRequest.from_pb(request)
        summary["model"] = generation.model or self._pool.catalog.default_model
        async for event in self._text.generate(generation):
            _summarize(event, summary)
            yield event.to_pb()

    @unary_rpc
    async def ListModels(
        self, request: pb.ListModelsRequest, summary: Summary
    ) -> pb.ListModelsResponse:
        catalog = self._pool.catalog
        loaded = {model.name: model for model in self._pool.loaded()}
        infos = []
        for name in catalog.names():
            spec = catalog.resolve(name)
            model = loaded.get(name)
            infos.append(
                pb.ModelInfo(
                    name=name,
                    source=spec.source,
                    backend=model.backend.name if model else "",
                    capabilities=[pb.CAPABILITY_TEXT],
                    is_default=name == catalog.default_model,
                    loaded=model is not None,
                    last_used_unix_ms=int(model.last_used * 1000) if model else 0,
                    context_length=model.backend.context_length if model else 0,
                )
            )
        return pb.ListModelsResponse(models=infos, default_model=catalog.default_model)

    @unary_rpc
    async def Admit(self, request: pb.AdmitRequest, summary: Summary) -> pb.AdmitResponse:
        raise NotImplementedYet("Admit is not implemented in this build yet")

    @stream_rpc
    async def GenerateImage(
        self, request: pb.GenerateImageRequest, summary: Summary
    ) -> AsyncIterator[pb.GenerateImageResponse]:
        raise NotImplementedYet("GenerateImage is not implemented in this build yet")
        yield  # an async generator, like every streaming RPC


def _summarize(event: object, summary: Summary) -> None:
    if isinstance(event, Started):
        summary.update(model=event.model, backend=event.backend, prompt_tokens=event.prompt_tokens)
    elif isinstance(event, Finished):
        summary.update(
            completion_tokens=event.usage.completion_tokens,
            cached_prompt_tokens=event.usage.cached_prompt_tokens,
            ttft_ms=round(event.timing.ttft_ms, 1),
            finish_reason=event.finish_reason.label,
        )
