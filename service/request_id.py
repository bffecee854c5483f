"""Request ids: the client's `x-request-id`, or one made up, on every log line of the RPC."""

from __future__ import annotations

import contextlib
import contextvars
import re
import uuid
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import structlog

METADATA_KEY = "x-request-id"
_ACCEPTABLE = re.compile(r"[A-Za-z0-9._:/@+=-]{1,128}")
T = TypeVar("T")


def request_id_from(metadata: Iterable[tuple[str, Any]] | None) -> str:
    """The caller's id when it is short and printable; otherwise a fresh one."""
    for key, value in metadata or ():
        if key == METADATA_KEY and isinstance(value, str) and _ACCEPTABLE.fullmatch(value):
            return value
    return uuid.uuid4().hex


def current_request_id() -> str:
    """The id of the RPC this task serves ("" outside one). service.front.rpc binds it into
    structlog's context for its own log lines; the front reads it back from there
    to hand it to an engine process, which has no such context."""
    value = structlog.contextvars.get_contextvars().get("request_id")
    return value if isinstance(value, str) else ""


def bound_request_id(request_id: str) -> contextlib.AbstractContextManager[object]:
    """Within it, every log line of this thread carries `request_id` (nothing is
    bound for "": a request that came without one, such as a test's)."""
    if not request_id:
        return contextlib.nullcontext()
    return structlog.contextvars.bound_contextvars(request_id=request_id)


def in_this_context(task: Callable[[], T]) -> Callable[[], T]:
    """`task`, to run on another thread with the caller's context variables, the
    request id among them: a thread or pool does not inherit them."""
    context = contextvars.copy_context()
    return lambda: context.run(task)
