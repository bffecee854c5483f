"""Serving one Generate request: pick the model, build the prompt, decode.

All model work (tokenizing, templating, decoding) runs on the model's worker
thread; this module only sequences it and relays events to the servicer. The
model's scheduler decodes this request in one batch with the others.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from service.backends.base import TextBackend
from service.chat_template import render_chat
from service.config import Settings
from service.decode.loop import DecodePlan, fit_max_tokens
from service.generation import GenerationEvent, GenerationRequest, Started
from service.models.pool import LoadedModel, ModelPool


@dataclass(frozen=True)
class _Prepared:
    started: Started
    plan: DecodePlan


class TextGenerator:
    def __init__(self, pool: ModelPool, settings: Settings) -> None:
        self._pool = pool
        self._settings = settings

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        received_at = time.monotonic()
        async with self._pool.use(request.model) as model:
            prepared = await model.worker.call(lambda: self._prepare(model, request))
            yield prepared.started
            async for event in model.decoder.stream(prepared.plan, received_at):
                yield event

    def _prepare(self, model: LoadedModel, request: GenerationRequest) -> _Prepared:
        model.ensure_usable()
        backend = model.text
        prompt_ids = _prompt_ids(model, request)
        max_tokens = fit_max_tokens(
            prompt_tokens=len(prompt_ids),
            requested=request.max_tokens,
            default=self._settings.default_max_tokens,
            context_length=backend.context_length,
        )
        plan = DecodePlan(
            prompt_ids=tuple(prompt_ids),
            max_tokens=max_tokens,
            stop=request.stop,
            sampling=request.sampling.resolve(backend.sampling_defaults()),
            time_limit_s=self._settings.max_decode_seconds,
        )
        started = Started(
            model=model.name,
            backend=backend.name,
            prompt_tokens=len(prompt_ids),
            context_length=backend.context_length,
        )
        return _Prepared(started, plan)


def _prompt_ids(model: LoadedModel, request: GenerationRequest) -> list[int]:
    backend: TextBackend = model.text
    if request.prompt is not None:
        return backend.tokenize(request.prompt, add_bos=backend.adds_bos)
    tokens = backend.template_tokens
    text = render_chat(
        model.spec.chat_template or backend.chat_template,
        request.messages,
        tokens,
        model.name,
    )
    # Templates that write the BOS token themselves must not get a second one.
    bos = tokens.get("bos_token", "")
    add_bos = backend.adds_bos and not (bos and text.startswith(bos))
    return backend.tokenize(text, add_bos=add_bos)
