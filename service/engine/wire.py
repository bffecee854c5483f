"""Requests and outcomes in the engine contract's messages (protos/inference/engine).

A request crosses as the client's own message, which the front validated,
plus what the front computed from it (the compiled grammar, the image seed).
An outcome crosses as a status code and message: a `ServiceError` keeps its
code and words; anything else is a bug of ours, logged with its traceback in
the engine, and the client gets INTERNAL with a generic message.
"""

from __future__ import annotations

import grpc
import structlog

from inference.engine.v1 import engine_pb2 as epb
from inference.v1 import inference_pb2 as pb
from service import errors
from service.errors import INTERNAL_MESSAGE
from service.images.requests import ImageRequest, RenderedImage
from service.text.requests import GenerationLimits, GenerationRequest, Grammar

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
OK = grpc.StatusCode.OK.value[0]
_CODE_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}


def status_of(error: BaseException | None) -> epb.Status:
    if error is None:
        return epb.Status(code=OK)
    if isinstance(error, errors.ServiceError):
        return epb.Status(code=error.code.value[0], message=error.message)
    log.error("unhandled error", exc_info=error)
    return epb.Status(code=errors.BackendFailure.code.value[0], message=INTERNAL_MESSAGE)


def code_name(code: int) -> str:
    """The status code's name, as the front's log lines write it: "INVALID_ARGUMENT"."""
    return _CODE_NAMES.get(code, str(code))


def error_of(status: epb.Status) -> errors.ServiceError:
    kind = _ERRORS.get(status.code, errors.BackendFailure)
    return kind(status.message or INTERNAL_MESSAGE)


def generate_message(
    socket_id: int, request: GenerationRequest, received_at: float, *, request_id: str
) -> epb.ToEngine:
    """`socket_id` keys the request on this socket; `request_id` is the RPC's, for logs."""
    if request.message is None:
        raise ValueError("an engine process serves requests converted from their message")
    generate = epb.Generate(
        id=socket_id, received_at=received_at, request=request.message, request_id=request_id
    )
    if request.grammar is not None:
        generate.grammar = request.grammar.text
        generate.grammar_branches = request.grammar.branches
    return epb.ToEngine(generate=generate)


def generation_request(generate: epb.Generate) -> GenerationRequest:
    grammar = None
    if generate.HasField("grammar"):
        grammar = Grammar(generate.grammar, generate.grammar_branches or 1)
    # The front enforced the server's limits; the engine takes its word for them.
    limits = GenerationLimits(max_top_logprobs=generate.request.top_logprobs)
    return GenerationRequest.from_pb(generate.request, limits, grammar=grammar)


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
