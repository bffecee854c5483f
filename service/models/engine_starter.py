"""Starting a model's engine: in a process of its own (the default) or in the front."""

from __future__ import annotations

from pathlib import Path

from service.config import Settings
from service.engine.base import Engine, EngineHooks
from service.engine.liveness import Liveness
from service.engine.local import LocalEngine
from service.engine.options import EngineOptions
from service.engine.process import EngineProcess
from service.errors import NotSupported
from service.model_source import ModelSource
from service.models.catalog import ModelSpec
from service.models.pool import EngineStarter


def engine_options(spec: ModelSpec, path: Path, backend: str, settings: Settings) -> EngineOptions:
    """The spec's options, and the server-wide ones an engine applies itself."""
    return EngineOptions(
        name=spec.name,
        backend=backend,
        path=path,
        model=spec.options,
        max_waiting_sequences=settings.max_waiting_sequences,
        chat_template=spec.chat_template,
        default_max_tokens=settings.default_max_tokens,
        max_decode_seconds=settings.max_decode_seconds,
        log_level=settings.log_level,
        request_token_budget=settings.request_token_budget,
        embed_batch_tokens=settings.embed_batch_tokens,
    )


def engine_starter(settings: Settings) -> EngineStarter:
    """What the pool calls to load a model, per --engine-mode."""

    async def start(
        spec: ModelSpec, source: ModelSource, backend: str, hooks: EngineHooks
    ) -> Engine:
        if source.path is None:
            raise NotSupported(f"model {spec.name!r} is not on local disk")
        options = engine_options(spec, source.path, backend, settings)
        if settings.engine_mode == "in-process":
            return await LocalEngine.start(options, hooks)
        liveness = Liveness(
            settings.engine_hang_seconds,
            settings.engine_stall_seconds,
            settings.image_cancel_seconds,
        )
        return await EngineProcess.start(options, hooks, liveness)

    return start
