"""The Inference servicer: a thin adapter from protobuf to the service."""

from __future__ import annotations

from collections.abc import AsyncIterator

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from service.admission import Capability
from service.admission.report import AdmissionReport
from service.errors import NotImplementedYet
from service.generation import Finished, GenerationRequest, Started
from service.models.catalog import ModelSpec
from service.models.pool import LoadedModel, ModelPool
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
        specs = [catalog.resolve(name) for name in catalog.names()]
        specs += [model.spec for model in loaded.values() if not model.spec.configured]
        infos = [_model_info(spec, loaded.get(spec.name), catalog.default_model) for spec in specs]
        return pb.ListModelsResponse(models=infos, default_model=catalog.default_model)

    @unary_rpc
    async def Admit(self, request: pb.AdmitRequest, summary: Summary) -> pb.AdmitResponse:
        spec = self._pool.catalog.resolve(request.model)
        capability = Capability(request.capability or pb.CAPABILITY_TEXT)
        decision = await self._pool.admission(spec, capability)
        weights, kv_cache = decision.memory_bytes(spec.context_size)
        loaded = any(model.name == spec.name for model in self._pool.loaded())
        report = AdmissionReport(
            decision=decision,
            weights_bytes=weights,
            kv_cache_bytes=kv_cache,
            plan=self._pool.plan(0 if loaded else weights + kv_cache, spec.name),
            budget_bytes=self._pool.limits.budget_bytes,
            used_bytes=self._pool.used_bytes(),
            loaded=loaded,
        )
        summary.update(model=spec.name, admitted=report.admitted, backend=decision.backend)
        return report.to_pb()

    @stream_rpc
    async def GenerateImage(
        self, request: pb.GenerateImageRequest, summary: Summary
    ) -> AsyncIterator[pb.GenerateImageResponse]:
        raise NotImplementedYet("GenerateImage is not implemented in this build yet")
        yield  # an async generator, like every streaming RPC


def _model_info(spec: ModelSpec, model: LoadedModel | None, default: str) -> pb.ModelInfo:
    info = pb.ModelInfo(
        name=spec.name,
        source=spec.label,
        capabilities=[pb.CAPABILITY_TEXT],
        is_default=spec.name == default,
        loaded=model is not None,
    )
    if model is not None:
        info.backend = model.backend.name
        info.memory_bytes = model.memory_bytes
        info.last_used_unix_ms = int(model.last_used * 1000)
        info.context_length = model.backend.context_length
    return info


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
