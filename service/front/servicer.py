"""The Inference servicer: a thin adapter from protobuf to the service."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from pathlib import Path

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from service.admission import Capability, Decision
from service.backends.names import EXTERNAL
from service.embeddings.requests import EmbedRequest
from service.errors import InvalidRequest
from service.front.auth import BearerAuth
from service.front.conversion import generation_request
from service.front.limits import RequestLimits
from service.front.metrics import Metrics
from service.front.offload import Offload
from service.front.overload import ConcurrencyGate
from service.front.rpc import Summary, stream_rpc, unary_rpc
from service.hub.disk import free_bytes
from service.hub.inventory import CachedModel
from service.hub.pull import PullState
from service.images.requests import ImageDone, ImageLimits, ImageRequest
from service.memory import MemoryNeed
from service.models.admit_report import AdmissionReport, download_pb
from service.models.catalog import ModelSpec
from service.models.pool import LoadedModel, ModelPool, memory_need
from service.models.sources import check_model_name
from service.serving.embeddings import EmbeddingService
from service.serving.images import ImageGenerator
from service.serving.outbox import ahead_of_reader
from service.serving.pulls import Pulls
from service.serving.text import TextGenerator
from service.text.requests import (
    FinishReason,
    GenerationLimits,
    GenerationRequest,
    tokenize_request,
)


class InferenceServicer(pb_grpc.InferenceServicer):
    def __init__(
        self,
        pool: ModelPool,
        text: TextGenerator,
        images: ImageGenerator,
        image_limits: ImageLimits,
        gate: ConcurrencyGate,
        request_limits: RequestLimits,
        default_image_model: str = "",
        metrics: Metrics | None = None,
        auth: BearerAuth | None = None,
        generation_limits: GenerationLimits | None = None,
        offload: Offload | None = None,
        pulls: Pulls | None = None,
        stream_buffer_bytes: int = 1 << 20,
        send_stall_seconds: float = 30.0,
        default_embedding_model: str = "",
    ) -> None:
        self.metrics = metrics
        self.auth = auth
        self._gate = gate
        self._request_limits = request_limits
        self._generation_limits = generation_limits or GenerationLimits()
        self._pool = pool
        self._text = text
        self._images = images
        self._image_limits = image_limits
        self._default_image_model = default_image_model
        self.offload = offload or Offload()
        self._pulls = pulls or Pulls(pool, None, "this server does not download models")
        self._stream_buffer_bytes = stream_buffer_bytes
        self.send_stall_seconds = send_stall_seconds
        self._embeddings = EmbeddingService(pool)
        self._default_embedding_model = default_embedding_model

    @stream_rpc
    async def Generate(
        self, request: pb.GenerateRequest, summary: Summary
    ) -> AsyncGenerator[pb.GenerateResponse, None]:
        received_at = time.monotonic()  # the contract's clock for ttft_ms and queue_ms
        # What costs nothing is checked on the event loop; converting the request
        # (a grammar to compile, thousands of messages) is not, and runs off it.
        check_model_name(request.model)
        self._request_limits.check(request)
        generation = await self.offload.run(generation_request, request, self._generation_limits)
        summary["model"] = generation.model or self._pool.catalog.default_model
        # Before a slot is taken: a download holds no model's place. The client
        # hears how it goes, not silence.
        pulled: PullState | None = None
        pull_began = time.monotonic()
        # Each generator iterated across a yield is closed as the stream ends, however
        # it ends: see stream_rpc.
        async with aclosing(self._pulls.before_generate(summary["model"])) as pulling:
            async for pulled in pulling:
                yield pb.GenerateResponse(pull_progress=_progress_pb(pulled))
        pull_ms = round((time.monotonic() - pull_began) * 1000) if pulled else 0
        generated = self._generated(
            generation, received_at, summary, pulled, pull_ms, request.report_loading
        )
        async with aclosing(ahead_of_reader(generated, self._stream_buffer_bytes)) as responses:
            async for response in responses:
                yield response

    async def _generated(
        self,
        generation: GenerationRequest,
        received_at: float,
        summary: Summary,
        pulled: PullState | None,
        pull_ms: int,
        report_loading: bool = False,
    ) -> AsyncGenerator[pb.GenerateResponse, None]:
        """The generation, holding a slot until it ends, not until the client has read it."""
        generating = self._text.generate(generation, received_at, report_loading)
        async with self._gate.slot(summary["model"]), aclosing(generating):
            async for response in generating:
                kind = response.WhichOneof("event")
                if kind == "started":
                    if pulled is not None:
                        response.started.pull_ms = pull_ms
                        response.started.pulled_bytes = pulled.transferred
                    _summarize_start(response.started, summary)
                elif kind == "finished":
                    _summarize_end(response.finished, summary)
                    if self.metrics is not None:
                        self.metrics.generation(response.finished, summary["model"])
                yield response

    @unary_rpc
    async def Tokenize(self, request: pb.TokenizeRequest, summary: Summary) -> pb.TokenizeResponse:
        check_model_name(request.model)
        as_generation = pb.GenerateRequest(
            model=request.model,
            prompt=request.prompt,
            messages=request.messages,
            tools=request.tools,
        )
        self._request_limits.check(as_generation)
        tokenize = await self.offload.run(tokenize_request, request)
        summary["model"] = tokenize.model or self._pool.catalog.default_model
        async with self._gate.slot(summary["model"]):
            answer = await self._text.tokenize(tokenize)
        summary.update(model=answer.model, prompt_tokens=len(answer.token_ids))
        return answer

    @unary_rpc
    async def Detokenize(
        self, request: pb.DetokenizeRequest, summary: Summary
    ) -> pb.DetokenizeResponse:
        check_model_name(request.model)
        self._request_limits.check(pb.GenerateRequest(prompt_token_ids=request.token_ids))
        summary["model"] = request.model or self._pool.catalog.default_model
        async with self._gate.slot(summary["model"]):
            answer = await self._text.detokenize(request.model, request.token_ids)
        summary.update(model=answer.model, tokens=len(request.token_ids))
        return answer

    @unary_rpc
    async def ListModels(
        self, request: pb.ListModelsRequest, summary: Summary
    ) -> pb.ListModelsResponse:
        catalog = self._pool.catalog
        loaded = {model.name: model for model in self._pool.loaded()}
        specs = [catalog.resolve(name) for name in catalog.names()]
        specs += [model.spec for model in loaded.values() if not model.spec.configured]
        # What can never load, from metadata (files are read: off the event loop).
        unloaded = [spec for spec in specs if spec.name not in loaded]
        reasons = await asyncio.to_thread(self._pool.unloadable_reasons, unloaded)
        infos = [
            _model_info(spec, loaded.get(spec.name), catalog.default_model, reasons)
            for spec in specs
        ]
        return pb.ListModelsResponse(
            models=infos, default_model=catalog.default_model, load=self._load()
        )

    def _load(self) -> pb.ServerLoad:
        gate = self._gate
        return pb.ServerLoad(
            running=gate.active,
            waiting=gate.waiting,
            max_running=gate.max_active,
            max_waiting=gate.max_waiting,
        )

    @unary_rpc
    async def Embed(self, request: pb.EmbedRequest, summary: Summary) -> pb.EmbedResponse:
        received_at = time.monotonic()
        check_model_name(request.model)
        embed = EmbedRequest.from_pb(request, self._default_embedding_model)
        summary.update(model=embed.model, inputs=len(embed.inputs))
        async with self._gate.slot(embed.model):
            embedded, backend = await self._embeddings.embed(embed)
        total_ms = (time.monotonic() - received_at) * 1000
        summary.update(backend=backend, prompt_tokens=sum(embedded.tokens))
        return embedded.to_pb(embed.model, total_ms)

    @unary_rpc
    async def Admit(self, request: pb.AdmitRequest, summary: Summary) -> pb.AdmitResponse:
        check_model_name(request.model)
        summary["model"] = request.model
        capability = _capability(request.capability)
        route = None
        if capability is Capability.IMAGE:
            route = await self._images.route(request.model)
        if route is not None:
            decision = await self._images.external_decision(route)
            report = self._report(decision, MemoryNeed(), name=route.model)
        else:
            # Resolving a reference looks at the disk and the hub cache.
            spec = await asyncio.to_thread(self._pool.catalog.resolve, request.model)
            report = await self._admission_report(spec, capability)
        summary.update(admitted=report.admitted, backend=report.decision.backend)
        return report.to_pb()

    @stream_rpc
    async def Pull(
        self, request: pb.PullRequest, summary: Summary
    ) -> AsyncGenerator[pb.PullResponse, None]:
        check_model_name(request.model)
        summary["model"] = request.model
        capability = _capability(request.capability)
        started = False
        transferred = 0
        async with aclosing(self._pulls.transfer(request.model, capability)) as steps:
            async for step in steps:
                if not started:
                    started = True
                    yield _pull_started(step.decision, step.state.cached)
                yield pb.PullResponse(progress=_progress_pb(step.state))
                transferred = step.state.transferred
        # Resolved afresh: the reference now leads into the cache.
        spec = await asyncio.to_thread(self._pool.catalog.resolve, request.model)
        report = await self._admission_report(spec, capability)
        summary.update(admitted=report.admitted, transferred=transferred)
        yield pb.PullResponse(
            finished=pb.PullFinished(
                model=request.model, bytes_transferred=transferred, admit=report.to_pb()
            )
        )

    @unary_rpc
    async def ListCached(
        self, request: pb.ListCachedRequest, summary: Summary
    ) -> pb.ListCachedResponse:
        models = await self._pulls.cached()
        summary["repos"] = len(models)
        return _cached_pb(models, self._pulls.cache_dir)

    @unary_rpc
    async def DeleteCached(
        self, request: pb.DeleteCachedRequest, summary: Summary
    ) -> pb.DeleteCachedResponse:
        summary["model"] = request.model
        commits, freed = await self._pulls.delete(request.model)
        summary.update(freed_bytes=freed)
        return pb.DeleteCachedResponse(commits=commits, freed_bytes=freed)

    @stream_rpc
    async def GenerateImage(
        self, request: pb.GenerateImageRequest, summary: Summary
    ) -> AsyncGenerator[pb.GenerateImageResponse, None]:
        received_at = time.monotonic()
        check_model_name(request.model)
        image_request = ImageRequest.from_pb(request, self._image_limits, self._default_image_model)
        summary.update(model=image_request.model, seed=image_request.seed)
        rendered = self._rendered(image_request, received_at, summary)
        async with aclosing(ahead_of_reader(rendered, self._stream_buffer_bytes)) as responses:
            async for response in responses:
                yield response

    async def _rendered(
        self, request: ImageRequest, received_at: float, summary: Summary
    ) -> AsyncGenerator[pb.GenerateImageResponse, None]:
        """The image's events, holding a slot until it is made, not until it is read."""
        rendering = self._images.generate(request, received_at=received_at)
        async with self._gate.slot(request.model), aclosing(rendering):
            async for event in rendering:
                if isinstance(event, ImageDone):
                    if self.metrics is not None:
                        self.metrics.image(event)
                    summary.update(backend=event.backend, width=event.image.width)
                    summary.update(height=event.image.height, total_ms=round(event.total_ms, 1))
                yield event.to_pb()

    async def _admission_report(self, spec: ModelSpec, capability: Capability) -> AdmissionReport:
        decision = await self._pool.admission(spec, capability)
        return self._report(decision, memory_need(decision, spec), spec.name)

    def _report(self, decision: Decision, need: MemoryNeed, name: str) -> AdmissionReport:
        pool = self._pool
        model = next((model for model in pool.loaded() if model.name == name), None)
        loaded = model is not None
        plan = pool.plan(0, name) if loaded else pool.plan(need.host_bytes, name, need.device_bytes)
        return AdmissionReport(
            decision=decision,
            need=need,
            plan=plan,
            limits=pool.limits,
            used_bytes=pool.used_bytes(),
            used_device_bytes=pool.used_device_bytes(),
            loaded=loaded,
            measured=None if model is None else model.engine.memory(),
        )


def _pull_started(decision: Decision, cached: int) -> pb.PullResponse:
    assert decision.download is not None
    started = pb.PullStarted(download=download_pb(decision.download), cached_bytes=cached)
    return pb.PullResponse(started=started)


def _progress_pb(state: PullState) -> pb.PullProgress:
    return pb.PullProgress(
        file=state.file,
        file_bytes_done=state.file_done,
        file_bytes_total=state.file_total,
        bytes_done=state.done,
        bytes_total=state.total,
        bytes_per_second=state.rate,
    )


def _cached_pb(models: list[CachedModel], cache_dir: Path | None) -> pb.ListCachedResponse:
    repos = [
        pb.CachedRepo(
            repo=model.repo_id,
            revisions=[
                pb.CachedRevision(
                    commit=revision.commit,
                    refs=revision.refs,
                    files=[pb.HubFile(path=n, size_bytes=b) for n, b in revision.files.items()],
                    size_bytes=revision.size,
                    last_modified_unix_ms=int(revision.last_modified * 1000),
                )
                for revision in model.revisions
            ],
            size_bytes=model.size,
            incomplete_bytes=model.incomplete,
            last_used_unix_ms=int(model.last_used * 1000),
        )
        for model in models
    ]
    if cache_dir is None:
        return pb.ListCachedResponse(repos=repos)
    return pb.ListCachedResponse(
        repos=repos, cache_dir=str(cache_dir), disk_free_bytes=free_bytes(cache_dir)
    )


def _capability(value: int) -> Capability:
    try:
        return Capability(value or pb.CAPABILITY_TEXT)
    except ValueError:
        raise InvalidRequest(
            f"unknown capability {value}; use CAPABILITY_TEXT, CAPABILITY_IMAGE or CAPABILITY_EMBED"
        ) from None


def _model_info(
    spec: ModelSpec, model: LoadedModel | None, default: str, unloadable: dict[str, str]
) -> pb.ModelInfo:
    # Until a model is loaded its kind is only known for the external image command
    # and the embedded models.
    capability = pb.CAPABILITY_IMAGE if spec.backend == EXTERNAL else pb.CAPABILITY_TEXT
    if spec.embeds:
        capability = pb.CAPABILITY_EMBED
    info = pb.ModelInfo(
        name=spec.name,
        source=spec.label,
        capabilities=[model.capability.value if model else capability],
        is_default=spec.name == default,
        loaded=model is not None,
        unloadable_reason=unloadable.get(spec.name, ""),
    )
    if model is not None:
        engine = model.engine
        info.backend = engine.info.backend
        info.memory_bytes = model.memory_bytes
        info.last_used_unix_ms = int(model.last_used * 1000)
        info.context_length = engine.info.context_length
        info.engine_pid = engine.pid or 0
        measured = engine.memory()
        if measured is not None:
            info.rss_bytes = measured.rss_bytes
            info.gpu_memory_bytes = measured.gpu_bytes
    return info


def _summarize_start(started: pb.GenerationStarted, summary: Summary) -> None:
    summary.update(
        model=started.model, backend=started.backend, prompt_tokens=started.prompt_tokens
    )


def _summarize_end(finished: pb.GenerationFinished, summary: Summary) -> None:
    summary.update(
        completion_tokens=finished.usage.completion_tokens,
        cached_prompt_tokens=finished.usage.cached_prompt_tokens,
        ttft_ms=round(finished.timing.ttft_ms, 1),
        finish_reason=FinishReason(finished.finish_reason).label,
    )
