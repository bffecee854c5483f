"""Requests and outcomes in the engine contract's messages (protos/inference/engine).

A text request crosses as the engine's own `TextRequest`: what the front
validated and computed (the compiled grammar), which the engine takes at its
word. An image request crosses as the client's message, which the front
validated, with the seed it drew.
An outcome crosses as a status code and message: a `ServiceError` keeps its
code and words, the field it names (`param`) and, where its class says more
than its code (ContextOverflow), its class; anything else is a bug of ours,
logged with its traceback in the engine, and the client gets INTERNAL with a
generic message.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from typing import Any

import grpc
import structlog

from inference.engine.v1 import engine_pb2 as epb
from inference.v1 import inference_pb2 as pb
from service import errors
from service.embeddings.requests import EmbedRequest, inputs_from_pb
from service.errors import INTERNAL_MESSAGE
from service.images.requests import ImageRequest, RenderedImage
from service.text.requests import (
    ChatMessage,
    GenerationRequest,
    Grammar,
    SamplingOverrides,
    Tool,
    ToolChoice,
)

log = structlog.get_logger("engine")

# The error each status code comes back as on the front.
_ERRORS: dict[int, type[errors.ServiceError]] = {
    error.code.value[0]: error
    for error in (
        errors.InvalidRequest,
        errors.ModelNotFound,
        errors.NotSupported,
        errors.AccessDenied,
        errors.Overloaded,
        errors.Unauthenticated,
        errors.Unavailable,
        errors.TimedOut,
        errors.BackendFailure,
    )
}
# Errors that say more than their code, by name.
_PRECISE: dict[str, type[errors.ServiceError]] = {
    error.__name__: error for error in (errors.ContextOverflow,)
}
OK = grpc.StatusCode.OK.value[0]
_CODE_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}


def status_of(error: BaseException | None) -> epb.Status:
    if error is None:
        return epb.Status(code=OK)
    if isinstance(error, errors.ServiceError):
        name = type(error).__name__
        return epb.Status(
            code=error.code.value[0],
            message=error.message,
            param=error.param or "",
            error=name if name in _PRECISE else "",
        )
    log.error("unhandled error", exc_info=error)
    return epb.Status(code=errors.BackendFailure.code.value[0], message=INTERNAL_MESSAGE)


def code_name(code: int) -> str:
    """The status code's name, as the front's log lines write it: "INVALID_ARGUMENT"."""
    return _CODE_NAMES.get(code, str(code))


def error_of(status: epb.Status) -> errors.ServiceError:
    kind = _PRECISE.get(status.error) or _ERRORS.get(status.code, errors.BackendFailure)
    return kind(status.message or INTERNAL_MESSAGE, param=status.param or None)


def generate_message(
    socket_id: int, request: GenerationRequest, received_at: float, *, request_id: str
) -> epb.ToEngine:
    """`socket_id` keys the request on this socket; `request_id` is the RPC's, for logs."""
    generate = epb.Generate(
        id=socket_id, received_at=received_at, request_id=request_id, text=text_request(request)
    )
    return epb.ToEngine(generate=generate)


def text_request(request: GenerationRequest) -> epb.TextRequest:
    """The validated request as the engine takes it."""
    message = epb.TextRequest(
        model=request.model,
        messages=[turn.to_pb() for turn in request.messages],
        stop=request.stop,
        sampling=_sampling_pb(request.sampling),
        tools=[tool.to_pb() for tool in request.tools],
        logprobs=request.logprobs,
        top_logprobs=request.top_logprobs,
        prompt_token_ids=request.prompt_token_ids,
    )
    if request.prompt is not None:
        message.prompt = request.prompt
    if request.max_tokens is not None:
        message.max_tokens = request.max_tokens
    if request.grammar is not None:
        message.grammar = request.grammar.text
        message.grammar_branches = request.grammar.branches
    if request.tool_choice is not None:
        message.tool_choice.CopyFrom(request.tool_choice.to_pb())
    return message


def generation_request(generate: epb.Generate) -> GenerationRequest:
    """The front's validated request, taken at its word: nothing is checked again."""
    text = generate.text
    sampling = text.sampling
    return GenerationRequest(
        model=text.model,
        prompt=text.prompt if text.HasField("prompt") else None,
        messages=tuple(ChatMessage.from_pb(turn) for turn in text.messages),
        max_tokens=text.max_tokens if text.HasField("max_tokens") else None,
        stop=tuple(text.stop),
        sampling=SamplingOverrides(
            **_fields_set(sampling), logit_bias=tuple(sorted(sampling.logit_bias.items()))
        ),
        tools=tuple(Tool.from_pb(tool) for tool in text.tools),
        grammar=(
            Grammar(text.grammar, text.grammar_branches or 1) if text.HasField("grammar") else None
        ),
        logprobs=text.logprobs,
        top_logprobs=text.top_logprobs,
        tool_choice=(
            ToolChoice.from_pb(text.tool_choice) if text.HasField("tool_choice") else None
        ),
        prompt_token_ids=tuple(text.prompt_token_ids),
    )


def tokenize_message(
    socket_id: int, request: GenerationRequest, *, request_id: str
) -> epb.ToEngine:
    """What to tokenize: `request`'s prompt or messages, and its tools."""
    tokenize = epb.Tokenize(
        id=socket_id,
        request_id=request_id,
        messages=[turn.to_pb() for turn in request.messages],
        tools=[tool.to_pb() for tool in request.tools],
    )
    if request.prompt is not None:
        tokenize.prompt = request.prompt
    return epb.ToEngine(tokenize=tokenize)


def tokenize_request(tokenize: epb.Tokenize, model: str) -> GenerationRequest:
    """What to tokenize, as the request whose prompt it would be."""
    return GenerationRequest(
        model=model,
        prompt=tokenize.prompt if tokenize.HasField("prompt") else None,
        messages=tuple(ChatMessage.from_pb(turn) for turn in tokenize.messages),
        max_tokens=None,
        stop=(),
        sampling=SamplingOverrides(),
        tools=tuple(Tool.from_pb(tool) for tool in tokenize.tools),
    )


def detokenize_message(
    socket_id: int, token_ids: Sequence[int], *, request_id: str
) -> epb.ToEngine:
    detokenize = epb.Detokenize(id=socket_id, request_id=request_id, token_ids=token_ids)
    return epb.ToEngine(detokenize=detokenize)


# Sampling's optional scalars (logit_bias, a map, crosses apart).
_OPTIONAL = tuple(field.name for field in fields(SamplingOverrides) if field.name != "logit_bias")


def _sampling_pb(sampling: SamplingOverrides) -> epb.Sampling:
    message = epb.Sampling(logit_bias=dict(sampling.logit_bias))
    for name in _OPTIONAL:
        value = getattr(sampling, name)
        if value is not None:  # unset: the model's default, not a zero
            setattr(message, name, value)
    return message


def _fields_set(sampling: epb.Sampling) -> dict[str, Any]:
    return {name: getattr(sampling, name) for name in _OPTIONAL if sampling.HasField(name)}


def image_message(
    socket_id: int, request: ImageRequest, received_at: float, *, request_id: str
) -> epb.ToEngine:
    message = pb.GenerateImageRequest(
        model=request.model,
        prompt=request.prompt,
        negative_prompt=request.negative_prompt,
        seed=request.seed,
    )
    for name in ("width", "height", "steps", "guidance"):
        value = getattr(request, name)
        if value is not None:
            setattr(message, name, value)
    image = epb.GenerateImage(
        id=socket_id, received_at=received_at, request=message, request_id=request_id
    )
    return epb.ToEngine(generate_image=image)


def image_request(image: epb.GenerateImage) -> ImageRequest:
    message = image.request
    return ImageRequest(
        model=message.model,
        prompt=message.prompt,
        negative_prompt=message.negative_prompt,
        width=message.width if message.HasField("width") else None,
        height=message.height if message.HasField("height") else None,
        steps=message.steps if message.HasField("steps") else None,
        guidance=message.guidance if message.HasField("guidance") else None,
        seed=message.seed,
    )


def rendered_image_pb(image: RenderedImage) -> epb.RenderedImage:
    return epb.RenderedImage(png=image.png, width=image.width, height=image.height)


def rendered_image(message: epb.RenderedImage) -> RenderedImage:
    return RenderedImage(message.png, message.width, message.height)


def embed_message(
    socket_id: int, request: EmbedRequest, received_at: float, *, request_id: str
) -> epb.ToEngine:
    embed = epb.Embed(
        id=socket_id,
        received_at=received_at,
        request_id=request_id,
        inputs=request.to_pb(),
        normalize=request.normalize,
        truncate=request.truncate,
    )
    return epb.ToEngine(embed=embed)


def embed_request(embed: epb.Embed, model: str) -> EmbedRequest:
    return EmbedRequest(model, inputs_from_pb(embed.inputs), embed.normalize, embed.truncate)
