"""Errors of the service domain, each carrying the gRPC status it maps to.

    ServiceError
    ├── InvalidRequest        INVALID_ARGUMENT     the request itself is wrong
    │   └── ContextOverflow   INVALID_ARGUMENT     the prompt and max_tokens exceed the context
    ├── ModelNotFound         NOT_FOUND            no model by that name
    ├── NotSupported          FAILED_PRECONDITION  the model cannot do what was asked
    ├── AccessDenied          PERMISSION_DENIED    a path outside the allowed roots
    ├── Overloaded            RESOURCE_EXHAUSTED   no room to serve it now
    ├── Unauthenticated       UNAUTHENTICATED      no valid bearer token
    ├── Unavailable           UNAVAILABLE          try again: the model is being reloaded
    ├── Aborted               ABORTED              another party changed what it worked on
    ├── TimedOut              DEADLINE_EXCEEDED    a server-side time limit passed
    ├── DataLoss              DATA_LOSS            fetched bytes are not what was promised
    └── BackendFailure        INTERNAL             the model library failed

Code raises these; `service.front.rpc` turns them into statuses in one place. Any
other exception becomes INTERNAL with a generic message and a logged traceback.
An error may name the request field at fault (`param`, OpenAI's name for it): the
HTTP port shows it; a gRPC status has the message only.
"""

from __future__ import annotations

from typing import ClassVar

import grpc


class ServiceError(Exception):
    """Base of every error a client is told about by its message."""

    code: ClassVar[grpc.StatusCode] = grpc.StatusCode.INTERNAL

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class InvalidRequest(ServiceError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class ContextOverflow(InvalidRequest):
    """The prompt, with the tokens asked for, does not fit the model's context window:
    a client can shorten the conversation and retry (OpenAI's context_length_exceeded)."""


class ModelNotFound(ServiceError):
    code = grpc.StatusCode.NOT_FOUND


class NotSupported(ServiceError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class AccessDenied(ServiceError):
    code = grpc.StatusCode.PERMISSION_DENIED


class Overloaded(ServiceError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unauthenticated(ServiceError):
    code = grpc.StatusCode.UNAUTHENTICATED


class Unavailable(ServiceError):
    code = grpc.StatusCode.UNAVAILABLE


class Aborted(ServiceError):
    code = grpc.StatusCode.ABORTED


class TimedOut(ServiceError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class DataLoss(ServiceError):
    code = grpc.StatusCode.DATA_LOSS


class BackendFailure(ServiceError):
    code = grpc.StatusCode.INTERNAL


# What a client is told when the server itself failed (the log has the traceback).
INTERNAL_MESSAGE = "internal error while serving the request; the server log has details"


def excerpt(text: str, limit: int = 64) -> str:
    """`text` quoted for an error message or a log line, cut to about `limit` characters.

    Client input can be megabytes long; messages and logs must stay bounded, so
    anything the client sent is shown through this, never whole.
    """
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"
