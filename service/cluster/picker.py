"""The endpoint picker: an Envoy external processor (ext_proc) that chooses the
replica for each inference request.

Envoy sends it the body of each Generate, GenerateImage and Admit request (the
gRPC frame with the request message), naming the method in the stream's
metadata; a configuration that sends the headers too works as well, with one
more round trip. From the body it reads the model and the prompt, ranks the
replicas (`ranking`) and answers with one header, `x-inference-endpoint:
best,next,...`, which Envoy's override-host load balancer follows: the first
address, and the next on each retry. A body it cannot read is ranked by load
alone; any other method goes where Envoy's own least-request balancing sends
it. If the picker is down or slow, Envoy does the same (failure_mode_allow), so
serving goes on without it.

OpenAI-compatible HTTP goes the same way (methods ChatCompletions and
Completions: POST /v1/chat/completions and /v1/completions, the JSON body whole).
The body becomes the GenerateRequest the replica itself will make of it (the
replica's own translation, service.front.openai_api.requests), so a conversation
hashes alike over gRPC and over HTTP and finds the same cached prefix; the
replicas it names are their HTTP ports (`--replica HOST:PORT=HTTP_PORT`).

Between two polls of the replicas' load, the requests it sent each count too.
With --metrics-listen it serves Prometheus metrics (`metrics`): its decisions by
reason, their time, the replicas up, the polls' time. With --health-listen it also
serves grpc.health.v1 alone there (for a kubelet's probe; --listen stays on loopback).

    inference-picker --replica 10.0.0.5:50051 --replica 10.0.0.6:50051
"""

from __future__ import annotations

import asyncio
import random
import signal
import struct
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import grpc
import structlog
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc
from google.protobuf.message import DecodeError, Message
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from inference.v1 import inference_pb2 as pb
from service.cluster.metrics import PickerMetrics
from service.cluster.prefix_table import PrefixTable
from service.cluster.prompt_blocks import Block, chained_blocks, generation_pieces
from service.cluster.ranking import ranked
from service.cluster.replicas import ReplicaMonitor
from service.cluster.settings import PickerSettings, load_picker_settings
from service.errors import ServiceError
from service.front.openai_api.requests import chat_request, completion_request, parse_body
from service.log import configure_logging

log = structlog.get_logger("picker")

ENDPOINT_HEADER = "x-inference-endpoint"
# Envoy's routes for the routed methods name the method in the ext_proc stream's
# metadata, so the picker needs no headers message (envoy.yaml.j2).
METHOD_METADATA = "x-inference-method"
GRPC_ROUTED: dict[str, type[Message]] = {
    "Generate": pb.GenerateRequest,
    "GenerateImage": pb.GenerateImageRequest,
    "Admit": pb.AdmitRequest,
}
SERVICE_PATH = "/inference.v1.Inference/"
# OpenAI-compatible HTTP: each route's method, and how its JSON body becomes the
# GenerateRequest the replica makes of it. GET /v1/models is not routed.
HTTP_ROUTED: dict[str, Callable[[dict[str, object]], pb.GenerateRequest]] = {
    "ChatCompletions": chat_request,
    "Completions": completion_request,
}
HTTP_PATHS = {"/v1/chat/completions": "ChatCompletions", "/v1/completions": "Completions"}
ROUTED = (*GRPC_ROUTED, *HTTP_ROUTED)
_SKIP_BODY = processing_mode_pb2.ProcessingMode(
    request_body_mode=processing_mode_pb2.ProcessingMode.NONE
)
_CLEAR_CLIENT_CHOICE = ext.HeaderMutation(remove_headers=[ENDPOINT_HEADER])


@dataclass
class RoutingInput:
    """What routing reads from a request: its model (None: no model a replica
    could have loaded decides) and its prompt as blocks."""

    model: str | None
    blocks: list[Block] = field(default_factory=list)


def routing_input(message: Message) -> RoutingInput:
    if isinstance(message, pb.GenerateRequest):
        pieces = generation_pieces(message)
        return RoutingInput(message.model, chained_blocks(pieces, model=message.model))
    if isinstance(message, pb.GenerateImageRequest):
        return RoutingInput(message.model or None)
    assert isinstance(message, pb.AdmitRequest)
    return RoutingInput(message.model)


def read_json_body(body: bytes, method: str) -> pb.GenerateRequest | None:
    """The GenerateRequest an OpenAI-compatible HTTP body (of ChatCompletions or
    Completions) asks for, as the replica will read it. None if it is not JSON, or
    JSON the replica will refuse (it answers 400 wherever it goes)."""
    try:
        return HTTP_ROUTED[method](parse_body(body))
    except ServiceError:
        return None


def read_grpc_message(body: bytes, message_type: type[Message]) -> Message | None:
    """The request message in a unary request's body, or as much of it as has
    arrived: every field that is there whole (a prompt cut short still routes by
    its model and its first messages). None if the body is compressed or garbage."""
    if len(body) < 5:
        return None
    compressed, length = struct.unpack(">BI", body[:5])
    if compressed:
        return None  # grpc-encoding: routed by load alone
    payload = bytes(body[5 : 5 + length])
    message = message_type()
    try:
        message.ParseFromString(payload[: whole_fields_end(payload)])
    except DecodeError:
        return None  # the replica answers INVALID_ARGUMENT
    return message


def whole_fields_end(payload: bytes) -> int:
    """Where the last field that arrived whole ends: a message is a run of fields,
    so the bytes up to there are a valid message with the fields that came."""
    position = end = 0
    while position < len(payload):
        tag, position = _varint(payload, position)
        wire_type = tag & 7
        if wire_type == 0:
            _, position = _varint(payload, position)
        elif wire_type == 2:
            length, position = _varint(payload, position)
            position += length
        elif wire_type in (1, 5):
            position += 8 if wire_type == 1 else 4
        else:
            break  # groups: not in our messages
        if position > len(payload):
            break
        end = position
    return end


def _varint(data: bytes, position: int) -> tuple[int, int]:
    """A base-128 varint at `position`; past the end if it is cut short."""
    value = shift = 0
    while position < len(data):
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position
        shift += 7
    return value, len(data) + 1


class _Exchange:
    """One request on its way through Envoy: the method, and what is owed back."""

    def __init__(self, method: str) -> None:
        self.method = ""
        self.name(method)
        self.defer_headers = False  # Envoy sends the body before our headers answer
        self.headers_owed = False
        self.decided = False

    def name(self, method: str) -> None:
        self.method = method if method in ROUTED else ""

    @property
    def routed(self) -> bool:
        return bool(self.method)

    @property
    def http(self) -> bool:
        """An OpenAI-compatible HTTP request: sent to the replicas' HTTP ports."""
        return self.method in HTTP_ROUTED

    def read(self, body: bytes) -> RoutingInput | None:
        """What routing reads of the body; None if it cannot be read."""
        if self.method in HTTP_ROUTED:
            request = read_json_body(body, self.method)
            return routing_input(request) if request is not None else None
        message = read_grpc_message(body, GRPC_ROUTED[self.method])
        return routing_input(message) if message is not None else None


class EndpointPicker(ext_grpc.ExternalProcessorServicer):  # type: ignore[misc]  # untyped
    """Envoy's configuration (envoy.yaml.j2) streams the body without waiting for
    the picker's answer to the headers, so the picker holds that answer until the
    body's first chunk is in and answers both at once, the headers carrying its
    choice: one round trip. Sent the body only after answering the headers (a
    BUFFERED configuration), it puts its choice in the body's answer instead."""

    def __init__(
        self,
        monitor: ReplicaMonitor,
        table: PrefixTable,
        *,
        balance: int,
        tie_seed: int | None = None,
        metrics: PickerMetrics | None = None,
    ) -> None:
        self._monitor = monitor
        self._table = table
        self._balance = balance
        self._ties = random.Random(tie_seed)
        self._metrics = metrics

    async def Process(
        self,
        request_iterator: AsyncIterator[ext.ProcessingRequest],
        context: grpc.aio.ServicerContext[ext.ProcessingRequest, ext.ProcessingResponse],
    ) -> AsyncIterator[ext.ProcessingResponse]:
        metadata = dict(context.invocation_metadata() or ())
        exchange = _Exchange(str(metadata.get(METHOD_METADATA, "")))
        async for message in request_iterator:
            for answer in self._answers(message, exchange):
                yield answer

    def _answers(
        self, message: ext.ProcessingRequest, exchange: _Exchange
    ) -> list[ext.ProcessingResponse]:
        if message.HasField("protocol_config"):  # on the first message
            config = message.protocol_config
            exchange.defer_headers = config.send_body_without_waiting_for_header_response
        kind = message.WhichOneof("request")
        if kind == "request_headers":
            return self._on_headers(message.request_headers, exchange)
        if kind == "request_body":
            return self._on_body(message.request_body, exchange)
        # Only request headers and bodies are configured; answer anything else unchanged.
        assert kind is not None
        return [ext.ProcessingResponse(**{kind: _empty_answer(kind)})]

    def _on_headers(
        self, headers: ext.HttpHeaders, exchange: _Exchange
    ) -> list[ext.ProcessingResponse]:
        path = _header(headers, ":path")
        if path.startswith(SERVICE_PATH):
            exchange.name(path.removeprefix(SERVICE_PATH))
        elif path.partition("?")[0] in HTTP_PATHS:
            exchange.name(HTTP_PATHS[path.partition("?")[0]])
        if not exchange.routed:  # not routed: Envoy balances it
            return [_headers_answer(_CLEAR_CLIENT_CHOICE, skip_body=True)]
        if headers.end_of_stream:  # no body at all: by load alone
            return [_headers_answer(self._decide(None, exchange))]
        if exchange.defer_headers:
            exchange.headers_owed = True
            return []
        return [_headers_answer(_CLEAR_CLIENT_CHOICE)]

    def _on_body(self, body: ext.HttpBody, exchange: _Exchange) -> list[ext.ProcessingResponse]:
        if exchange.decided or not exchange.routed:
            return [_body_answer(ext.HeaderMutation())]
        choice = self._decide(body.body, exchange)
        if not exchange.headers_owed:
            return [_body_answer(choice)]
        exchange.headers_owed = False
        return [_headers_answer(choice), _body_answer(ext.HeaderMutation())]

    def _decide(self, body: bytes | None, exchange: _Exchange) -> ext.HeaderMutation:
        """The answer for a request whose body is `body` (None: it has none)."""
        started = time.perf_counter()
        exchange.decided = True
        routing = exchange.read(body) if body is not None else None
        blocks = routing.blocks if routing else []
        model = routing.model if routing else None
        matched = self._table.matched_chars(blocks)
        replicas = list(self._monitor.replicas.values())
        if exchange.http:  # only those whose HTTP port the picker knows
            replicas = [replica for replica in replicas if replica.http_port is not None]
        ranking = ranked(replicas, model, matched, balance=self._balance, ties=self._ties)
        prefix_chars = matched.get(ranking.order[0], 0) if ranking.order else 0
        if ranking.order:
            self._monitor.replicas[ranking.order[0]].routed += 1
            self._table.record(ranking.order[0], blocks)
            log.debug(
                "routed", model=model, to=ranking.order, reason=ranking.reason,
                prefix_chars=prefix_chars,
            )  # fmt: skip
        metrics = self._metrics
        if metrics is not None:
            if routing is None:
                metrics.unread.labels(exchange.method).inc()
            if blocks and ranking.order:
                metrics.prompt_chars.inc(blocks[-1].end)
                metrics.prefix_chars.inc(prefix_chars)
            metrics.prefix_blocks.set(len(self._table))
            metrics.decided(exchange.method, ranking.reason, time.perf_counter() - started)
        if not ranking.order:
            return _CLEAR_CLIENT_CHOICE  # nothing known to be up: Envoy balances it
        if exchange.http:
            by_address = self._monitor.replicas
            return _endpoint_choice([str(by_address[a].http_address) for a in ranking.order])
        return _endpoint_choice(ranking.order)


def _endpoint_choice(order: list[str]) -> ext.HeaderMutation:
    value = ",".join(order).encode()
    mutation: ext.HeaderMutation = ext.HeaderMutation(
        set_headers=[
            base_pb2.HeaderValueOption(
                header=base_pb2.HeaderValue(key=ENDPOINT_HEADER, raw_value=value),
                append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
            )
        ]
    )
    return mutation


def _headers_answer(
    mutation: ext.HeaderMutation, *, skip_body: bool = False
) -> ext.ProcessingResponse:
    answer: ext.ProcessingResponse = ext.ProcessingResponse(
        request_headers=ext.HeadersResponse(response=ext.CommonResponse(header_mutation=mutation))
    )
    if skip_body:
        answer.mode_override.CopyFrom(_SKIP_BODY)
    return answer


def _body_answer(mutation: ext.HeaderMutation) -> ext.ProcessingResponse:
    answer: ext.ProcessingResponse = ext.ProcessingResponse(
        request_body=ext.BodyResponse(response=ext.CommonResponse(header_mutation=mutation))
    )
    return answer


def _header(headers: ext.HttpHeaders, name: str) -> str:
    for header in headers.headers.headers:
        if header.key == name:
            return str(header.raw_value.decode("utf-8", "replace") or header.value)
    return ""


def _empty_answer(kind: str) -> Message:
    answer: Message
    if kind.endswith("_headers"):
        answer = ext.HeadersResponse()
    elif kind.endswith("_body"):
        answer = ext.BodyResponse()
    else:
        answer = ext.TrailersResponse()
    return answer


# --- the program -----------------------------------------------------------------


@dataclass
class RunningPicker:
    port: int  # ext_proc and health
    metrics_port: int | None  # None: no --metrics-listen
    health_port: int | None  # None: no --health-listen
    monitor: ReplicaMonitor
    metrics: PickerMetrics


@asynccontextmanager
async def running_picker(settings: PickerSettings) -> AsyncIterator[RunningPicker]:
    """The picker serving, polling and (with --metrics-listen) serving metrics until
    the block ends; then it drains for --grace-period and stops."""
    table = PrefixTable(settings.prefix_capacity)
    # The monitor reports to the metrics, which read the monitor's view: the
    # callbacks name `metrics` before it is made, and run only once polling starts.

    def lost(address: str) -> None:
        table.forget(address)
        metrics.prefix_blocks.set(len(table))

    monitor = ReplicaMonitor(
        settings.replica,
        settings.replicas_dns,
        interval=settings.poll_interval,
        timeout=settings.poll_timeout,
        token=settings.replica_token.get_secret_value() if settings.replica_token else None,
        on_lost=lost,
        on_poll=lambda outcome, seconds: metrics.polled(outcome, seconds),
    )
    metrics = PickerMetrics(
        lambda: monitor.view, methods=ROUTED, prefix_capacity=settings.prefix_capacity
    )
    server = grpc.aio.server()
    picker = EndpointPicker(
        monitor, table, balance=settings.balance, tie_seed=settings.tie_seed, metrics=metrics
    )
    ext_grpc.add_ExternalProcessorServicer_to_server(picker, server)
    health_servicer = health.aio.HealthServicer()  # type: ignore[attr-defined]
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (ext.DESCRIPTOR.services_by_name["ExternalProcessor"].full_name, health.SERVICE_NAME),
        server,
    )
    port = server.add_insecure_port(settings.listen)
    if port == 0:
        raise SystemExit(f"cannot listen on {settings.listen}")
    # Health alone, sharing the main port's statuses, on the same event loop: it
    # answers only while the loop that routes does.
    health_server = None
    health_port = None
    if settings.health_listen:
        health_server = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, health_server)
        health_port = health_server.add_insecure_port(settings.health_listen)
        if health_port == 0:
            raise SystemExit(f"cannot listen on {settings.health_listen}")
    await server.start()
    if health_server is not None:
        await health_server.start()
        log.info("health", address=settings.health_listen, port=health_port)
    polling = asyncio.create_task(monitor.run())
    try:
        metrics_port = None
        if settings.metrics_listen:
            metrics_port = metrics.serve(settings.metrics_listen)
            log.info("metrics", address=settings.metrics_listen, port=metrics_port)
        await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        host = settings.listen.rpartition(":")[0]
        log.info(
            "picking", address=f"{host}:{port}", replicas=settings.replica or settings.replicas_dns
        )
        yield RunningPicker(port, metrics_port, health_port, monitor, metrics)
        await health_servicer.enter_graceful_shutdown()
    finally:
        await server.stop(settings.grace_period)
        if health_server is not None:
            await health_server.stop(None)
        polling.cancel()
        await asyncio.gather(polling, return_exceptions=True)
        metrics.stop()


async def serve_picker(settings: PickerSettings) -> None:
    async with running_picker(settings):
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stopping.set)
        await stopping.wait()


def main(argv: Sequence[str] | None = None) -> None:
    settings = load_picker_settings(argv)
    configure_logging(settings)
    asyncio.run(serve_picker(settings))


if __name__ == "__main__":
    main()
