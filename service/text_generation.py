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
from service.backends.failure import library_failure
from service.chat_template import render_chat
from service.config import Settings
from service.decode.loop import DecodeEvent, DecodePlan, fit_max_tokens
from service.errors import ServiceError
from service.generation import Finished, GenerationEvent, GenerationRequest, Started
from service.models.pool import LoadedModel, ModelPool
from service.tools.base import ToolCallParser
from service.tools.conventions import parser_for_template, with_tool_calls


@dataclass(frozen=True)
class _Prepared:
    started: Started
    plan: DecodePlan
    tool_parser: ToolCallParser


class TextGenerator:
    def __init__(self, pool: ModelPool, settings: Settings) -> None:
        self._pool = pool
        self._settings = settings

    async def generate(
        self, request: GenerationRequest, received_at: float | None = None
    ) -> AsyncIterator[GenerationEvent]:
        """The events of one generation.

        `received_at` (time.monotonic) is when the request reached the server: the
        contract measures ttft_ms and queue_ms from there, so the caller takes it
        before converting the request and waiting for a concurrency slot. None: now.
        """
        if received_at is None:
            received_at = time.monotonic()
        async with self._pool.use(request.model) as model:
            prepared = await model.worker.call(lambda: self._prepare(model, request))
            yield prepared.started
            events = model.decoder.stream(prepared.plan, received_at)
            if request.tools:
                events = _with_parsed_tool_calls(events, prepared.tool_parser)
            async for event in events:
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
            grammar=request.grammar,
            top_logprobs=request.top_logprobs if request.logprobs else None,
        )
        started = Started(
            model=model.name,
            backend=backend.name,
            prompt_tokens=len(prompt_ids),
            context_length=backend.context_length,
        )
        return _Prepared(started, plan, parser_for_template(_template(model)))


def _prompt_ids(model: LoadedModel, request: GenerationRequest) -> list[int]:
    backend: TextBackend = model.text
    if request.prompt is not None:
        return _tokenize(model, request.prompt, add_bos=backend.adds_bos)
    tokens = backend.template_tokens
    text = _render(model, request, tokens)
    # Templates that write the BOS token themselves must not get a second one.
    bos = tokens.get("bos_token", "")
    add_bos = backend.adds_bos and not (bos and text.startswith(bos))
    return _tokenize(model, text, add_bos=add_bos)


def _tokenize(model: LoadedModel, text: str, *, add_bos: bool) -> list[int]:
    """The library's tokenizer; its failure is this request's (a tokenizer keeps no state)."""
    try:
        return model.text.tokenize(text, add_bos=add_bos)
    except ServiceError:
        raise
    except Exception as exc:
        raise library_failure(f"the tokenizer of model {model.name!r} failed", exc) from exc


def _render(model: LoadedModel, request: GenerationRequest, tokens: dict[str, str]) -> str:
    """The chat template rendered; a template that fails otherwise than by refusing
    (see render_chat) is the model file's fault, and this request's alone."""
    try:
        return render_chat(_template(model), request.messages, tokens, model.name, request.tools)
    except ServiceError:
        raise
    except Exception as exc:
        raise library_failure(f"the chat template of model {model.name!r} failed", exc) from exc


def _template(model: LoadedModel) -> str | None:
    """The chat template: the operator's for this model, else the model's own."""
    return model.spec.chat_template or model.text.chat_template


async def _with_parsed_tool_calls(
    events: AsyncIterator[DecodeEvent], parser: ToolCallParser
) -> AsyncIterator[DecodeEvent]:
    """Pass the events on; the final one also carries the tool calls in the text.

    The text itself streams as the model writes it, call blocks included: a
    call is only known to be one once its block is complete.
    """
    text: list[str] = []
    async for event in events:
        if isinstance(event, Finished):
            event = with_tool_calls(event, parser.parse("".join(text)))
        else:
            text.append(event.text)
        yield event
