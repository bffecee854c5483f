"""OpenAI-compatible HTTP, served beside the gRPC port by the same process.

    POST /v1/chat/completions   POST /v1/completions   POST /v1/responses
    GET /v1/models              GET /v1/models/{model}  GET /health

Each request becomes the contract's GenerateRequest (service.front.openai_api.requests)
and runs through the servicer's own Generate, below its gRPC wrapper: the same
validation, overload gate, model pool, pulls and generation metrics. This module
does for HTTP what `service.front.rpc` does for gRPC: the request id (`x-request-id`,
taken or made, sent back as a header and bound into the log lines), the bearer
token, one summary log line and the RPC metrics per request, and errors as
OpenAI's JSON error with the matching HTTP status, also for a path or method it
does not serve. A client that disconnects cancels its handler (aiohttp's handler
cancellation), and with it the generation. `/health` answers HTTP-only probes
and load balancers without a token, as grpc.health.v1 does on the gRPC port.

Responses keep the gRPC port's send discipline. The generation runs ahead of
its client by the servicer's bounded buffer (`service.serving.outbox`), so it
lets go of its slot and its model when it ends, and pauses while the buffer is
full. Each write, streamed or a whole answer, waits until the socket has taken
it (no other bytes wait in the process) within `--send-stall-seconds`
(`service.front.rpc.send_deadline`); past it the connection is dropped and the
request cancelled. A request body must all arrive within `--http-body-seconds`,
before the request takes a slot; else 408 and the connection closes.

`POST /tokenize` and `POST /detokenize` (vLLM's and llama-server's shapes, in
`tokens`) go to the servicer's Tokenize and Detokenize. Fields a request sends
that change nothing are named in its `x-ignored-fields` header and summary line.
With `--http-cors-origins`, `cors` answers browsers' preflights and marks every
answer to an allowed origin.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import ssl
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc
import structlog
from aiohttp import web
from aiohttp.typedefs import Middleware

from inference.v1 import inference_pb2 as pb
from service.errors import (
    InvalidRequest,
    ModelNotFound,
    ServiceError,
    Unavailable,
    excerpt,
)
from service.front.offload import Offload
from service.front.openai_api.body import (
    BodiesBuffered,
    BodyLimits,
    BodyReader,
    BodyTooLarge,
    BodyTooSlow,
)
from service.front.openai_api.connections import (
    ConnectionGuard,
    ConnectionLimits,
    GuardedSite,
    connection_of,
)
from service.front.openai_api.conversations import Conversations
from service.front.openai_api.cors import Cors
from service.front.openai_api.embeddings import (
    check_dimensions,
    embed_request,
    embeddings_body,
    encoding,
)
from service.front.openai_api.embeddings import ignored as ignored_embedding_fields
from service.front.openai_api.errors import Described, described, plain
from service.front.openai_api.requests import (
    MAX_CHOICES,
    Body,
    chat_request,
    choice_count,
    completion_requests,
    ignored_fields,
    nth_choice,
    parse_body,
    prompts,
    wants_usage_in_stream,
)
from service.front.openai_api.response_events import ResponseEvents, sse
from service.front.openai_api.responses import Reply, completion_id, usage_chunk_of, whole_of
from service.front.openai_api.responses_api import (
    recalled_history,
    translated_responses_request,
)
from service.front.openai_api.tokens import detokenize_request, tokenize_request
from service.front.rpc import send_deadline
from service.request_id import METADATA_KEY, request_id_from

if TYPE_CHECKING:
    from service.front.auth import BearerAuth
    from service.front.metrics import Metrics

log = structlog.get_logger("http")

Summary = dict[str, Any]
GenerateEvents = Callable[[pb.GenerateRequest, Summary], AsyncGenerator[pb.GenerateResponse, None]]
ListModels = Callable[[pb.ListModelsRequest, Summary], Awaitable[pb.ListModelsResponse]]
Work = Callable[["_Outcome"], Awaitable[web.StreamResponse]]
Events = AsyncGenerator[pb.GenerateResponse, None]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Tokenize = Callable[[pb.TokenizeRequest, Summary], Awaitable[pb.TokenizeResponse]]
Detokenize = Callable[[pb.DetokenizeRequest, Summary], Awaitable[pb.DetokenizeResponse]]
Embed = Callable[[pb.EmbedRequest, Summary], Awaitable[pb.EmbedResponse]]


def below_grpc(servicer: Any) -> tuple[GenerateEvents, ListModels]:
    """The servicer's Generate and ListModels without their gRPC wrapper
    (`service.front.rpc` wraps them with functools.wraps; this module wraps them for HTTP)."""
    kind = type(servicer)
    generate = functools.partial(kind.Generate.__wrapped__, servicer)
    list_models = functools.partial(kind.ListModels.__wrapped__, servicer)
    return generate, list_models


def embed_below_grpc(servicer: Any) -> Embed:
    """The servicer's Embed without its gRPC wrapper, as below_grpc."""
    return functools.partial(type(servicer).Embed.__wrapped__, servicer)


def tokenizer_below_grpc(servicer: Any) -> tuple[Tokenize, Detokenize]:
    """The servicer's Tokenize and Detokenize without their gRPC wrapper, as below_grpc."""
    kind = type(servicer)
    tokenize = functools.partial(kind.Tokenize.__wrapped__, servicer)
    detokenize = functools.partial(kind.Detokenize.__wrapped__, servicer)
    return tokenize, detokenize


class OpenAiHttp:
    def __init__(
        self,
        generate: GenerateEvents,
        list_models: ListModels,
        *,
        auth: BearerAuth | None,
        metrics: Metrics | None,
        body_limits: BodyLimits | None = None,
        connection_limits: ConnectionLimits | None = None,
        connection_cap: int | None = None,
        offload: Offload | None = None,
        serving: Callable[[], bool] = lambda: True,
        send_stall_seconds: float = 30.0,
        tokenizer: tuple[Tokenize, Detokenize] | None = None,
        cors_origins: frozenset[str] = frozenset(),
        max_choices: int = MAX_CHOICES,
        embed: Embed | None = None,
    ) -> None:
        """`max_choices`: how many generations one request may ask for at once (`n`
        times its prompts), at most what the gate holds of one model's requests.
        `connection_cap`: the most connections the file-descriptor limit allows
        (`service.front.descriptors`), below `connection_limits`' own cap."""
        self._generate = generate
        self._list_models = list_models
        self._tokenizer = tokenizer
        self._embed = embed
        self._max_choices = min(max_choices, MAX_CHOICES)
        self._auth = auth
        self._metrics = metrics
        self._serving = serving
        self._send_stall_seconds = send_stall_seconds
        body_limits = body_limits or BodyLimits()
        self._bodies = BodyReader(body_limits, offload or Offload())
        self._connection_limits = connection_limits or ConnectionLimits()
        self._guard = ConnectionGuard(self._connection_limits, connection_cap)
        cors = Cors(cors_origins)
        self._app = web.Application(
            client_max_size=body_limits.max_bytes,
            middlewares=[
                self._tracked,
                cors.preflight,
                _sent_within(send_stall_seconds, metrics),
                _unserved_as_openai_errors,
            ],
        )
        # On every response as its headers go out, streams and errors included.
        self._app.on_response_prepare.append(cors.add_headers)
        self._app.add_routes(
            [
                web.post("/v1/chat/completions", functools.partial(self._complete, chat=True)),
                web.post("/v1/completions", functools.partial(self._complete, chat=False)),
                web.post("/v1/responses", self._respond),
                web.post("/v1/embeddings", self._embeddings),
                web.get("/v1/models", self._models),
                # Hub ids hold a slash: org/name.
                web.get("/v1/models/{model:.+}", self._model),
                web.get("/health", self._health),
                web.post("/tokenize", self._tokenize),
                web.post("/detokenize", self._detokenize),
            ]
        )
        # The responses `previous_response_id` may continue, kept per server.
        self._conversations = Conversations()
        self._runner: web.AppRunner | None = None
        self._draining = False
        self._in_flight = 0
        self._idle = asyncio.Event()
        self.port: int | None = None

    async def start(self, host: str, port: int, tls: ssl.SSLContext | None = None) -> int:
        """Listen on host:port (0: any free port); the port bound."""
        # A handler is cancelled when its client disconnects: the generation stops. An
        # idle connection closes after `idle_seconds`, also before its first request.
        self._runner = web.AppRunner(
            self._app,
            handler_cancellation=True,
            access_log=None,
            keepalive_timeout=self._connection_limits.idle_seconds,
            # What drain() has not ended by then is cut: it waits no longer.
            shutdown_timeout=0.5,
        )
        await self._runner.setup()
        site = GuardedSite(self._runner, self._guard, host, port, ssl_context=tls)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        return self.port

    async def drain(self, grace_seconds: float) -> None:
        """Answer new requests and connections 503 (a proxy retries them elsewhere),
        close idle connections and those still sending a body at once, and give the
        requests in progress up to `grace_seconds` to finish; then cut what is left
        (its generation is cancelled with it) and stop listening."""
        self._draining = True  # new connections are still answered: 503, then closed
        self._guard.close_idle()
        if self._in_flight:
            self._idle.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), grace_seconds)
        self._guard.abort_all()
        if self._runner is not None:
            await self._runner.shutdown()
            await self._runner.cleanup()

    @web.middleware
    async def _tracked(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Its connection idle again once the answer is sent (while draining, an answer
        not yet sent says `Connection: close`; the drain cuts the rest at its end)."""
        try:
            response = await handler(request)
            if self._draining and not response.prepared:
                response.force_close()
            return response
        finally:
            connection = connection_of(request)
            if connection is not None:
                connection.request_done(body_read=request.content.at_eof())

    async def _body(self, request: web.Request) -> Body:
        """The request's JSON body, read within its budgets and parsed off the loop. A
        connection sending its body is cut at once by a drain: it holds no work yet."""
        connection = connection_of(request)
        if connection is not None:
            connection.reading_body = True
        try:
            raw = await self._bodies.read(request)
        finally:
            if connection is not None:
                connection.reading_body = False
        return await self._bodies.off_loop(parse_body, raw)

    def _enter(self) -> None:
        if self._draining:
            raise Unavailable("the server is draining; retry on another replica")
        self._in_flight += 1

    def _leave(self) -> None:
        self._in_flight -= 1
        if not self._in_flight:
            self._idle.set()

    # --- handlers ---------------------------------------------------------------------

    async def _complete(self, request: web.Request, chat: bool) -> web.StreamResponse:
        async def work(outcome: _Outcome) -> web.StreamResponse:
            body = await self._body(request)
            ignored, generations, count = await self._bodies.off_loop(_completions, body, chat)
            outcome.ignore(ignored)
            self._check_choices(count * len(generations))
            echoes = await self._echoes(body, outcome) if body.get("echo") else None
            ident = completion_id(chat)
            replies: list[Reply] = []
            choices: list[Events] = []
            # Choice 0 writes the request's summary line; the others count in it below.
            summaries: list[Summary] = []
            for number, generation in enumerate(generations):
                for nth in range(count):  # OpenAI's order: each prompt's n choices in turn
                    index = len(replies)
                    replies.append(
                        Reply(
                            chat,
                            ident,
                            index,
                            hold_text=bool(generation.tools),
                            forced=generation.HasField("tool_choice"),
                            echo=echoes[number] if echoes else "",
                            counts_prompt=nth == 0,
                        )
                    )
                    summaries.append(outcome.summary if index == 0 else {})
                    choices.append(self._generate(nth_choice(generation, nth), summaries[index]))
            try:
                if body.get("stream"):
                    return await outcome.stream(replies, choices, wants_usage_in_stream(body))
                await _each_event(choices, lambda index, event: _take(replies[index], event))
                return outcome.json(whole_of(replies))
            finally:
                _summarize_choices(summaries)
                await _closed(choices)

        name = "ChatCompletions" if chat else "Completions"
        return await self._outcome(name, request).answer(self._counted(work))

    async def _respond(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/responses: a chat completion in the Responses API's shapes."""

        async def work(outcome: _Outcome) -> web.StreamResponse:
            body = await self._body(request)
            history = recalled_history(body, self._conversations)
            asked = await self._bodies.off_loop(translated_responses_request, body, history)
            outcome.ignore(asked.ignored)
            answer = ResponseEvents(asked, self._conversations)
            events = self._generate(asked.generation, outcome.summary)
            try:
                if asked.stream:
                    frames = (sse(e) async for event in events for e in answer.events(event))
                    return await outcome.send_events(frames, answer.failed)
                async for event in events:
                    answer.events(event)
                return outcome.json(answer.response())
            finally:
                await _closed([events])

        return await self._outcome("Responses", request).answer(self._counted(work))

    def _check_choices(self, wanted: int) -> None:
        """Each choice is a generation with a place at the gate: more than the gate
        ever holds of one model's requests could never all run."""
        if wanted > self._max_choices:
            raise InvalidRequest(
                f"the request asks for {wanted} generations (`n` times its prompts); this "
                f"server runs or queues at most {self._max_choices} of one model's requests "
                "(--max-concurrent-per-model and --max-queue-per-model)",
                param="n",
            )

    async def _echoes(self, body: Body, outcome: _Outcome) -> list[str]:
        """With `echo`: each prompt's text, which its choices begin with (token ids are
        detokenized)."""
        texts = []
        for prompt in prompts(body):
            if isinstance(prompt, str):
                texts.append(prompt)
                continue
            asked = pb.DetokenizeRequest(model=str(body.get("model", "")), token_ids=prompt)
            texts.append((await self._tokenizer_of()[1](asked, {})).text)
        return texts

    def _tokenizer_of(self) -> tuple[Tokenize, Detokenize]:
        if self._tokenizer is None:
            raise Unavailable("this server was built without its tokenizer RPCs")
        return self._tokenizer

    async def _tokenize(self, request: web.Request) -> web.StreamResponse:
        """POST /tokenize (vLLM's and llama-server's): a prompt or messages to token ids."""

        async def work(outcome: _Outcome) -> web.StreamResponse:
            body = await self._body(request)
            asked, ignored = await self._bodies.off_loop(tokenize_request, body)
            outcome.ignore(ignored)
            answer = await self._tokenizer_of()[0](asked, outcome.summary)
            ids = list(answer.token_ids)
            return outcome.json(
                {"tokens": ids, "count": len(ids), "max_model_len": answer.context_length}
            )

        return await self._outcome("Tokenize", request).answer(self._counted(work))

    async def _detokenize(self, request: web.Request) -> web.StreamResponse:
        """POST /detokenize: token ids to their text."""

        async def work(outcome: _Outcome) -> web.StreamResponse:
            body = await self._body(request)
            asked, ignored = await self._bodies.off_loop(detokenize_request, body)
            outcome.ignore(ignored)
            answer = await self._tokenizer_of()[1](asked, outcome.summary)
            return outcome.json({"prompt": answer.text})

        return await self._outcome("Detokenize", request).answer(self._counted(work))

    async def _embeddings(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/embeddings: the Embed RPC in OpenAI's shapes (see embeddings.py)."""

        async def work(outcome: _Outcome) -> web.StreamResponse:
            body = await self._body(request)
            asked, encoding_format, ignored = await self._bodies.off_loop(_embedding, body)
            outcome.ignore(ignored)
            if self._embed is None:
                raise Unavailable("this server was built without its Embed RPC")
            answer = await self._embed(asked, outcome.summary)
            check_dimensions(body, answer.dimensions)
            return outcome.json(embeddings_body(answer, encoding_format))

        return await self._outcome("Embeddings", request).answer(self._counted(work))

    async def _models(self, request: web.Request) -> web.StreamResponse:
        async def work(outcome: _Outcome) -> web.StreamResponse:
            listed = await self._list_models(pb.ListModelsRequest(), outcome.summary)
            # The models a client may pick: one that can never load here is left out
            # (ListModels and GET /v1/models/{model} say why).
            models = [_model_object(m) for m in listed.models if not m.unloadable_reason]
            return outcome.json({"object": "list", "data": models})

        return await self._outcome("Models", request).answer(work)

    async def _model(self, request: web.Request) -> web.StreamResponse:
        """One model, as the SDK's `models.retrieve` asks for it."""
        name = request.match_info["model"]

        async def work(outcome: _Outcome) -> web.StreamResponse:
            listed = await self._list_models(pb.ListModelsRequest(), outcome.summary)
            for model in listed.models:
                if model.name == name and model.unloadable_reason:
                    raise ModelNotFound(
                        f"model {excerpt(name)} is known here but cannot be served: "
                        f"{model.unloadable_reason}"
                    )
                if model.name == name:
                    return outcome.json(_model_object(model))
            raise ModelNotFound(
                f"no model {excerpt(name)} is served here; GET /v1/models lists them"
            )

        return await self._outcome("Models", request).answer(work)

    async def _health(self, request: web.Request) -> web.StreamResponse:
        """200 while the server serves (its default model loaded, not draining), else 503:
        the status grpc.health.v1 gives the server as a whole."""
        if self._serving() and not self._draining:
            return web.json_response({"status": "ok"})
        return web.json_response({"status": "unavailable"}, status=503)

    def _outcome(self, method: str, request: web.Request) -> _Outcome:
        return _Outcome(method, request, self._auth, self._metrics, self._send_stall_seconds)

    def _counted(self, work: Work) -> Work:
        """`work`, refused while draining and counted while it runs."""

        async def counted(outcome: _Outcome) -> web.StreamResponse:
            self._enter()
            try:
                return await work(outcome)
            finally:
                self._leave()

        return counted


def _completions(body: Body, chat: bool) -> tuple[list[str], list[pb.GenerateRequest], int]:
    """A chat or completions body's ignored fields, generations and choices per prompt."""
    generations = [chat_request(body)] if chat else completion_requests(body)
    return ignored_fields(body, chat), generations, choice_count(body)


def _embedding(body: Body) -> tuple[pb.EmbedRequest, str, list[str]]:
    """An embeddings body's request, its encoding format and its ignored fields."""
    return embed_request(body), encoding(body), ignored_embedding_fields(body)


class _Outcome:
    """One HTTP request's id, bearer token, summary line and metrics, and the
    answer to an error: OpenAI's error JSON, or an error event once a stream began."""

    def __init__(
        self,
        method: str,
        request: web.Request,
        auth: BearerAuth | None,
        metrics: Metrics | None,
        send_stall_seconds: float,
    ) -> None:
        self.method = method
        self.summary: Summary = {}
        self.request_id = request_id_from([(METADATA_KEY, request.headers.get(METADATA_KEY, ""))])
        self._request = request
        self._auth = auth
        self._metrics = metrics
        self._stall_seconds = send_stall_seconds
        self._started = time.monotonic()
        self._stream: web.StreamResponse | None = None
        self._headers = {METADATA_KEY: self.request_id}
        # The field a context overflow blames (_OVERFLOW_PARAMS).
        self._overflow_param = _OVERFLOW_PARAMS.get(method, "prompt")
        # The events that end a stream on an error: chat's `data: {"error": ...}`, or
        # those `send_events` was given.
        self._error_events: Callable[[dict[str, Any]], bytes] = _event

    async def answer(self, work: Work) -> web.StreamResponse:
        structlog.contextvars.clear_contextvars()  # this request's task has a context of its own
        structlog.contextvars.bind_contextvars(request_id=self.request_id)
        if self._metrics is not None:
            self._metrics.rpc_started(self.method)
        try:
            if self._auth is not None:
                self._auth.check(
                    [("authorization", self._request.headers.get("Authorization", ""))]
                )
            response = await self._sent(await work(self))
        except ConnectionError:  # it went away while it was sent: as if it disconnected
            self._finish_cancelled()
            raise asyncio.CancelledError from None
        except Exception as exc:
            return await self._failed(exc)
        except BaseException:  # cancelled: the client went away (or stalled), and the generation
            self._finish_cancelled()
            raise
        self._finish(grpc.StatusCode.OK)
        return response

    def _finish_cancelled(self) -> None:
        self.summary.setdefault("error", "the client disconnected")  # or the stall's reason
        self._finish(grpc.StatusCode.CANCELLED)

    def ignore(self, fields: list[str]) -> None:
        """Say that the request's `fields` changed nothing: in the `x-ignored-fields`
        header of its answer and in its summary line."""
        if fields:
            named = [_header_safe(name) for name in fields[:MAX_IGNORED_NAMED]]
            if len(fields) > MAX_IGNORED_NAMED:
                named.append(f"and {len(fields) - MAX_IGNORED_NAMED} more")
            self._headers[IGNORED_HEADER] = ", ".join(named)
            self.summary["ignored_fields"] = named

    async def _failed(self, exc: Exception) -> web.StreamResponse:
        error: Described = described(exc, self._overflow_param)
        if not isinstance(exc, ServiceError):
            log.error("unhandled error", rpc=self.method, exc_info=exc)
        self.summary["error"] = error.message
        self._finish(error.status)
        body = error.body()
        try:
            if self._stream is not None:  # the stream began: the error is its last event
                await self._send(self._error_events(body))
                with self._sending():
                    await self._stream.write_eof()
                return self._stream
            status = _ERROR_STATUS.get(type(exc), error.http_status)
            response = web.json_response(
                body, status=status, headers={**self._headers, **error.headers(status)}
            )
            if isinstance(exc, BodyTooSlow | BodyTooLarge | BodiesBuffered):
                # The rest of the body is not read: the connection cannot carry another.
                return await self._closing(response)
            return await self._sent(response)
        except ConnectionError:  # the client is gone: aiohttp ends the connection
            return self._stream or web.Response()

    async def _closing(self, response: web.StreamResponse) -> web.StreamResponse:
        """`response`, then the connection closed at once: the rest of a body too slow
        to come would come as slowly (aiohttp would wait a while for it), and it is no
        request to read."""
        response.force_close()  # it says `Connection: close`
        await self._sent(response)
        self._request.protocol.force_close()
        return response

    def json(self, body: dict[str, Any]) -> web.Response:
        return web.json_response(body, headers=self._headers)

    def _sending(self) -> contextlib.AbstractContextManager[None]:
        """The send-stall bound on one send of this request's response."""
        return send_deadline(
            self._stall_seconds,
            self.method,
            self.summary,
            self._metrics,
            functools.partial(_drop, self._request),
        )

    async def _sent(self, response: web.StreamResponse) -> web.StreamResponse:
        """A whole answer, sent here within the send-stall bound rather than by aiohttp
        after the handler without one."""
        if not response.prepared:
            with self._sending():
                await response.prepare(self._request)
                await response.write_eof()  # waits until the socket has taken it all
        return response

    async def _send(self, data: bytes) -> None:
        """One write of the event stream, ended when the socket has taken it: the
        generation's buffer, not the connection's, holds what the client has not read."""
        with self._sending():
            stream = await self._begun()
            await stream.write(data)
            await self._request.writer.drain()

    async def stream(
        self, replies: list[Reply], choices: list[Events], with_usage: bool
    ) -> web.StreamResponse:
        """Server-sent events: one `data:` line per chunk (the choices' chunks as they
        come), then `data: [DONE]`. The response begins with the first chunk, so a
        refusal before it is a plain error."""
        writing = asyncio.Lock()

        async def send(index: int, event: pb.GenerateResponse) -> None:
            for chunk in replies[index].chunks(event):
                async with writing:
                    await self._send(_event(chunk))

        await _each_event(choices, send)
        if with_usage:
            await self._send(_event(usage_chunk_of(replies)))
        await self._send(b"data: [DONE]\n\n")
        stream = await self._begun()
        with self._sending():
            await stream.write_eof()
        return stream

    async def send_events(
        self,
        frames: AsyncIterator[bytes],
        on_error: Callable[[dict[str, Any]], list[dict[str, Any]]],
    ) -> web.StreamResponse:
        """Server-sent events as they come, each written as `stream` writes a chunk;
        an error after the first ends the stream with the events `on_error` makes
        of OpenAI's error body."""
        self._error_events = lambda body: b"".join(sse(event) for event in on_error(body))
        async for frame in frames:
            await self._send(frame)
        stream = await self._begun()
        with self._sending():
            await stream.write_eof()
        return stream

    async def _begun(self) -> web.StreamResponse:
        if self._stream is None:
            stream = web.StreamResponse(
                headers={
                    "Content-Type": "text/event-stream",
                    "Cache-Control": "no-cache",
                    **self._headers,
                }
            )
            await stream.prepare(self._request)
            self._stream = stream
        return self._stream

    def _finish(self, code: grpc.StatusCode) -> None:
        seconds = time.monotonic() - self._started
        if self._metrics is not None:
            model = str(self.summary.get("model", ""))
            self._metrics.rpc_finished(self.method, model, code.name, seconds)
        log.info(
            "rpc",
            rpc=self.method,
            code=code.name,
            duration_ms=round(seconds * 1000, 1),
            **self.summary,
        )


async def _each_event(
    choices: list[Events], handle: Callable[[int, pb.GenerateResponse], Awaitable[None]]
) -> None:
    """`handle` each event of each choice's generation, the choices running at once.
    One failing ends the others, and its error is the request's."""
    if len(choices) == 1:  # the usual request: no task of its own
        async for event in choices[0]:
            await handle(0, event)
        return

    async def follow(index: int, events: Events) -> None:
        async for event in events:
            await handle(index, event)

    try:
        async with asyncio.TaskGroup() as group:
            for index, events in enumerate(choices):
                group.create_task(follow(index, events))
    except ExceptionGroup as failed:
        raise failed.exceptions[0] from None


async def _closed(choices: list[Events]) -> None:
    """Close each generation now. One left open when its reader is cancelled (a client
    gone, a stalled send given up) keeps its slot until the garbage collector finds it,
    which an exception's reference cycle can put off for minutes."""
    for events in choices:
        await events.aclose()


async def _take(reply: Reply, event: pb.GenerateResponse) -> None:
    reply.take(event)


def _summarize_choices(summaries: list[Summary]) -> None:
    """With `n` above 1, the summary line counts every choice's tokens."""
    first, rest = summaries[0], summaries[1:]
    if rest:
        first["choices"] = len(summaries)
        tokens = [summary.get("completion_tokens", 0) for summary in summaries]
        first["completion_tokens"] = sum(tokens)


def _header_safe(name: str) -> str:
    """A client's field name as header text: escaped (no control characters, no
    non-ASCII), cut to 64 characters."""
    text = json.dumps(name)[1:-1]
    return text if len(text) <= 64 else text[:64] + "..."


def _model_object(model: pb.ModelInfo) -> dict[str, Any]:
    return {"id": model.name, "object": "model", "created": 0, "owned_by": model.backend or "local"}


@web.middleware
async def _unserved_as_openai_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A path or method not served, in OpenAI's error shape (a client parses that)."""
    try:
        return await handler(request)
    except (web.HTTPNotFound, web.HTTPMethodNotAllowed) as exc:
        message = f"this server does not serve {request.method} {excerpt(request.path)}"
        if isinstance(exc, web.HTTPMethodNotAllowed):
            message += f"; {request.path} takes {', '.join(sorted(exc.allowed_methods))}"
        allowed = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
        body = plain(grpc.StatusCode.NOT_FOUND, message).body()
        return web.json_response(body, status=exc.status, headers=allowed)


def _event(chunk: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"


_ERROR_STATUS: dict[type[Exception], int] = {BodyTooLarge: 413, BodyTooSlow: 408}
# The field a context overflow blames, by method: a completion's is its `prompt`.
_OVERFLOW_PARAMS = {"ChatCompletions": "messages", "Responses": "input"}
# Names the request's fields that changed nothing (see requests.ignored_fields): the
# first few, so a body of a million unknown keys makes no megabyte header.
IGNORED_HEADER = "x-ignored-fields"
MAX_IGNORED_NAMED = 16


def _drop(request: web.BaseRequest) -> None:
    """Give a stalled client up: its connection goes at once (what it did not read is
    dropped, not kept to flush for ever) and its handler is cancelled, with the generation."""
    if request.transport is not None:
        request.transport.abort()
    request.task.cancel()


def _sent_within(seconds: float, metrics: Metrics | None) -> Middleware:
    """Every response is sent within the send-stall bound: this sends those no handler
    sent itself (/health, paths not served). And a connection keeps no bytes of its
    own for a client that does not read: a write (its drain) waits until the socket
    has taken them all, not only most."""

    @web.middleware
    async def sent(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.transport is not None:
            request.transport.set_write_buffer_limits(high=0)
        response = await handler(request)
        if response.prepared:
            return response
        give_up = functools.partial(_drop, request)
        try:
            with send_deadline(seconds, "HTTP", {}, metrics, give_up):
                await response.prepare(request)
                await response.write_eof()
        except ConnectionError:  # the client is gone: aiohttp ends the connection
            pass
        return response

    return sent
