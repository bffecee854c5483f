"""The service's errors as OpenAI's: an HTTP status and `{"error": {...}}`.

One error tree serves both surfaces: each gRPC status a `ServiceError` carries
has the HTTP status an OpenAI client expects for it (its SDK raises
BadRequestError for 400, AuthenticationError for 401, NotFoundError for 404,
RateLimitError for 429, InternalServerError for 5xx). The errors that clients
tell apart by OpenAI's `code` carry it: `context_length_exceeded` (litellm's
ContextWindowExceededError and LangChain's ContextOverflowError fire on it and
on the message's "maximum context length"), `model_not_found`,
`invalid_api_key`, `rate_limit_exceeded`; any other carries its gRPC status's
name ("invalid_argument"). `param` names the request field at fault where the
service knows it. 429 and 503 say when to retry (`Retry-After`), which the SDKs
honour.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import grpc

from service.errors import (
    INTERNAL_MESSAGE,
    ContextOverflow,
    ModelNotFound,
    Overloaded,
    ServiceError,
    Unauthenticated,
)

_HTTP = {
    grpc.StatusCode.INVALID_ARGUMENT: (400, "invalid_request_error"),
    grpc.StatusCode.FAILED_PRECONDITION: (400, "invalid_request_error"),
    grpc.StatusCode.OUT_OF_RANGE: (400, "invalid_request_error"),
    grpc.StatusCode.UNAUTHENTICATED: (401, "authentication_error"),
    grpc.StatusCode.PERMISSION_DENIED: (403, "permission_error"),
    grpc.StatusCode.NOT_FOUND: (404, "not_found_error"),
    grpc.StatusCode.ABORTED: (409, "conflict_error"),
    grpc.StatusCode.DATA_LOSS: (502, "server_error"),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (429, "rate_limit_error"),
    grpc.StatusCode.UNAVAILABLE: (503, "service_unavailable"),
    grpc.StatusCode.DEADLINE_EXCEEDED: (504, "timeout"),
    grpc.StatusCode.UNIMPLEMENTED: (501, "not_implemented"),
}

# OpenAI's codes, for the errors its clients classify by them.
_CODES: dict[type[ServiceError], str] = {
    ContextOverflow: "context_length_exceeded",
    ModelNotFound: "model_not_found",
    Unauthenticated: "invalid_api_key",
    Overloaded: "rate_limit_exceeded",
}
# The field at fault when the error does not say.
_PARAMS: dict[type[ServiceError], str] = {ModelNotFound: "model"}

# What a 429 or a 503 tells a client to wait before it retries: a slot frees, or a
# draining replica's proxy sends the retry elsewhere, within about that long.
RETRY_AFTER_SECONDS = 1
_RETRIED = (429, 503)


@dataclass(frozen=True)
class Described:
    """What a client is told of one error."""

    status: grpc.StatusCode
    message: str
    code: str  # OpenAI's `code`
    param: str | None = None

    @property
    def http_status(self) -> int:
        return http_status(self.status)

    def body(self) -> dict[str, Any]:
        kind = _HTTP.get(self.status, (500, "server_error"))[1]
        error = {"message": self.message, "type": kind, "param": self.param, "code": self.code}
        return {"error": error}

    def headers(self, status: int | None = None) -> dict[str, str]:
        """`Retry-After` where the client should retry (429, 503)."""
        if (status or self.http_status) in _RETRIED:
            return {"Retry-After": str(RETRY_AFTER_SECONDS)}
        return {}


def http_status(code: grpc.StatusCode) -> int:
    return _HTTP.get(code, (500, ""))[0]


def plain(status: grpc.StatusCode, message: str) -> Described:
    """An error of the HTTP layer itself (a path not served)."""
    return Described(status, message, status.name.lower())


def described(exc: Exception, overflow_param: str | None = None) -> Described:
    """What a client is shown for `exc` (a bug of ours shows the generic message; its
    traceback goes to the log). `overflow_param` is the field a context overflow
    blames: "messages" for a chat, "prompt" for a completion."""
    if not isinstance(exc, ServiceError):
        return plain(grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE)
    kind = next((k for k in type(exc).__mro__ if k in _CODES), None)
    code = _CODES[kind] if kind is not None else exc.code.name.lower()
    param = exc.param
    if param is None and isinstance(exc, ContextOverflow):
        param = overflow_param
    if param is None and kind is not None:
        param = _PARAMS.get(kind)
    return Described(exc.code, exc.message, code, param)
