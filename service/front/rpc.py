"""Where exceptions become gRPC statuses, and where each RPC is logged.

Every servicer method is wrapped by `unary_rpc` or `stream_rpc`. Before the
method runs, the RPC gets its request id (bound into every log line and sent
back as `x-request-id` response metadata: in the headers of the first response
message, or in the trailers of an RPC that fails before it sends any) and,
when the server requires one, its bearer token is checked, a large request
still encoded is decoded off the event loop, and one whose bytes do not decode
is refused with INVALID_ARGUMENT. A `ServiceError` becomes its own status and
message; anything else becomes INTERNAL with a generic message and a logged
traceback. Each RPC writes one summary line with whatever the method put in
its `summary` dict.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import grpc
import structlog

from service.errors import INTERNAL_MESSAGE, InvalidRequest, ServiceError
from service.front.registration import EncodedRequest, UndecodableRequest
from service.request_id import METADATA_KEY, request_id_from

if TYPE_CHECKING:
    from service.front.auth import BearerAuth
    from service.front.metrics import Metrics
    from service.front.offload import Offload

log = structlog.get_logger("rpc")

Request = TypeVar("Request")
Response = TypeVar("Response")
Servicer = TypeVar("Servicer", bound="Observed")
Summary = dict[str, Any]
Context = grpc.aio.ServicerContext[Any, Any]

# Status messages travel in trailers, which clients cap at 8 KiB by default; every
# message should already be short (client input is shown through `excerpt`), and
# this keeps one that is not from breaking the client's connection.
MAX_STATUS_MESSAGE_CHARS = 2048


class Observed(Protocol):
    """A servicer whose RPCs are counted in its metrics, guarded by its auth, whose
    large requests are decoded on its offload pool, and whose streams give up on a
    client that takes nothing for `send_stall_seconds`."""

    metrics: Metrics | None
    auth: BearerAuth | None
    offload: Offload
    send_stall_seconds: float


class _RpcOutcome:
    """Tracks the status of one RPC for its summary line and metrics."""

    def __init__(self, method: str, metrics: Metrics | None) -> None:
        self.method = method
        self.summary: Summary = {}
        self.code = grpc.StatusCode.OK
        self._metrics = metrics
        self._started = time.monotonic()
        self._written = False
        self._request_id = ""
        self._answered = False
        if metrics is not None:
            metrics.rpc_started(method)

    def begin(self, context: Context, auth: BearerAuth | None) -> None:
        """Bind the request id, then check the bearer token (may raise)."""
        metadata = context.invocation_metadata()
        self._request_id = request_id_from(metadata)
        structlog.contextvars.clear_contextvars()  # this RPC's task has a context of its own
        structlog.contextvars.bind_contextvars(request_id=self._request_id)
        if auth is not None:
            auth.check(metadata)

    async def answering(self, context: Context) -> None:
        """Send the request id as response headers, once, just before the first
        response message. Until then nothing has gone back, so a refusal travels
        as a trailers-only response, which a proxy such as Envoy may retry on
        another replica; it is never retried once a token has been sent."""
        if not self._answered:
            self._answered = True
            await context.send_initial_metadata(((METADATA_KEY, self._request_id),))

    def cancelled(self, context: Context) -> None:
        remaining = context.time_remaining()
        expired = remaining is not None and remaining <= 0
        self.code = grpc.StatusCode.DEADLINE_EXCEEDED if expired else grpc.StatusCode.CANCELLED

    async def fail(self, context: Context, exc: Exception) -> None:
        """End the RPC with the status `exc` maps to (context.abort raises)."""
        if isinstance(exc, ServiceError):
            self.code, message = exc.code, _bounded(exc.message)
            self.summary["error"] = message
        else:
            self.code, message = grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE
            log.exception("unhandled error", rpc=self.method)
        # abort sends the status at once: count the RPC first, so that a client that
        # has seen the error also sees it in the metrics.
        self.write()
        if not self._answered and self._request_id:
            context.set_trailing_metadata(((METADATA_KEY, self._request_id),))
        await context.abort(self.code, message)

    def write(self) -> None:
        """The summary line and the metrics, once."""
        if self._written:
            return
        self._written = True
        seconds = time.monotonic() - self._started
        if self._metrics is not None:
            model = str(self.summary.get("model", ""))
            self._metrics.rpc_finished(self.method, model, self.code.name, seconds)
        log.info(
            "rpc",
            rpc=self.method,
            code=self.code.name,
            duration_ms=round(seconds * 1000, 1),
            **self.summary,
        )


def _bounded(message: str) -> str:
    if len(message) <= MAX_STATUS_MESSAGE_CHARS:
        return message
    return message[: MAX_STATUS_MESSAGE_CHARS - 20] + " ... (cut short)"


async def _decoded(servicer: Observed, request: Any) -> Any:
    """The request message, decoded off the event loop if it came encoded (see
    registration); InvalidRequest when its bytes do not decode."""
    if isinstance(request, EncodedRequest):
        request = await servicer.offload.run(request.decode)
    if isinstance(request, UndecodableRequest):
        raise InvalidRequest(
            f"the request is not a valid {request.message_type} message ({request.reason}); "
            "check that the client was generated from this server's inference.proto"
        )
    return request


@contextmanager
def send_deadline(
    seconds: float,
    method: str,
    summary: Summary,
    metrics: Metrics | None,
    give_up: Callable[[], object],
) -> Iterator[None]:
    """Give a stream up if one send, the block within, has not ended within `seconds`.

    Sends wait on the client: gRPC writes a yielded message while the handler is
    suspended at its yield, and an HTTP response's write waits for the socket to
    take it. A client that reads nothing (an HTTP/2 window of 0, an HTTP/1.1
    reader that stops) would keep the stream there, and its request open, for as
    long as its connection lives. Past `seconds` the summary line says why, the
    log warns, the metric counts it, and `give_up` ends the stream (cancels its
    task; over HTTP, drops the connection too), which through the handler's
    cleanup stops whatever was still producing for it. (A client that reads
    nothing may never see why: it waits behind what it did not read.) Both
    ports send this way, behind `service.serving.outbox`'s buffer."""
    timer = asyncio.get_running_loop().call_later(
        seconds, _stalled, seconds, method, summary, metrics, give_up
    )
    try:
        yield
    finally:
        timer.cancel()


def _stalled(
    seconds: float,
    method: str,
    summary: Summary,
    metrics: Metrics | None,
    give_up: Callable[[], object],
) -> None:
    summary["error"] = f"the client took no message for {seconds:g} s"
    log.warning("stream stalled", rpc=method, seconds=seconds)
    if metrics is not None:
        metrics.stream_stalled(method)
    give_up()


def unary_rpc(
    method: Callable[[Servicer, Request, Summary], Awaitable[Response]],
) -> Callable[[Servicer, Request, Context], Awaitable[Response]]:
    @functools.wraps(method)
    async def wrapper(self: Servicer, request: Request, context: Context) -> Any:
        outcome = _RpcOutcome(method.__name__, self.metrics)
        try:
            outcome.begin(context, self.auth)
            response = await method(self, await _decoded(self, request), outcome.summary)
            await outcome.answering(context)
            return response
        except asyncio.CancelledError:
            outcome.cancelled(context)
            raise
        except Exception as exc:
            await outcome.fail(context, exc)
        finally:
            outcome.write()

    return wrapper


def stream_rpc(
    method: Callable[[Servicer, Request, Summary], AsyncGenerator[Response, None]],
) -> Callable[[Servicer, Request, Context], Awaitable[None]]:
    """A streaming RPC whose handler writes each message itself (`context.write`).

    gRPC ends an RPC (a deadline, a cancel, a client gone) by cancelling the task
    that runs its handler. A handler that is an async generator is suspended at
    its yield while gRPC writes, so a cancel that comes then is raised in gRPC's
    own loop, not in the handler: nothing closes the generator, and whatever it
    holds (a concurrency slot, a sequence decoding to max_tokens) waits for the
    garbage collector, minutes when a reference cycle holds it. Here the cancel
    is raised inside the handler wherever the RPC is, and `aclosing` closes the
    method's generator, and through it everything it was iterating, at once."""

    @functools.wraps(method)
    async def wrapper(self: Servicer, request: Request, context: Context) -> None:
        outcome = _RpcOutcome(method.__name__, self.metrics)
        try:
            outcome.begin(context, self.auth)
            responses = method(self, await _decoded(self, request), outcome.summary)
            async with contextlib.aclosing(responses):
                async for response in responses:
                    await outcome.answering(context)
                    await _sent(self, outcome, context, response)
        except asyncio.CancelledError:
            outcome.cancelled(context)
            raise
        except Exception as exc:
            await outcome.fail(context, exc)
        finally:
            outcome.write()

    return wrapper


async def _sent(servicer: Observed, outcome: _RpcOutcome, context: Context, response: Any) -> None:
    """Write one message, giving the stream up past the send stall."""
    task = asyncio.current_task()
    assert task is not None
    seconds = servicer.send_stall_seconds
    with send_deadline(seconds, outcome.method, outcome.summary, servicer.metrics, task.cancel):
        await context.write(response)
