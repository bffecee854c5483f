"""The service's errors as OpenAI's: an HTTP status and `{"error": {...}}`.

One error tree serves both surfaces: each gRPC status a `ServiceError` carries
has the HTTP status an OpenAI client expects for it (its SDK raises
BadRequestError for 400, AuthenticationError for 401, NotFoundError for 404,
RateLimitError for 429, InternalServerError for 5xx).
"""

from __future__ import annotations

from typing import Any

import grpc

from service.errors import INTERNAL_MESSAGE, ServiceError

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


def http_status(code: grpc.StatusCode) -> int:
    return _HTTP.get(code, (500, ""))[0]


def error_body(message: str, code: grpc.StatusCode) -> dict[str, Any]:
    kind = _HTTP.get(code, (500, "server_error"))[1]
    return {"error": {"message": message, "type": kind, "param": None, "code": code.name.lower()}}


def described(exc: Exception) -> tuple[grpc.StatusCode, str]:
    """The status and the message a client is shown for `exc` (a bug of ours shows
    the generic message; its traceback goes to the log)."""
    if isinstance(exc, ServiceError):
        return exc.code, exc.message
    return grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE
