"""The endpoint picker: an Envoy external processor (ext_proc) that chooses the
replica for each inference request.

Envoy sends it the request's headers, then its body (the gRPC frame with the
request message). For Generate, GenerateImage and Admit it reads the model and
the prompt, ranks the replicas (`ranking`) and answers with one header,
`x-inference-endpoint: best,next,...`, which Envoy's override-host load
balancer follows: the first address, and the next on each retry. Any other
method, or a body it cannot read, goes where Envoy's own least-request
balancing sends it. If the picker is down or slow, Envoy does the same
(failure_mode_allow), so serving goes on without it.

The ext_proc stream lasts as long as the request, so the picker counts each
replica's requests in flight exactly, between its polls of their load.

    inference-picker --replica 10.0.0.5:50051 --replica 10.0.0.6:50051
"""

from __future__ import annotations

import asyncio
import signal
import struct
from collections.abc import AsyncIterator, Sequence
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
from service.cluster.prefix_table import PrefixTable
from service.cluster.prompt_blocks import Block, chained_blocks, generation_pieces
from service.cluster.ranking import rank
from service.cluster.replicas import Replica, ReplicaMonitor
from service.cluster.settings import PickerSettings, load_picker_settings
from service.log import configure_logging

log = structlog.get_logger("picker")

ENDPOINT_HEADER = "x-inference-endpoint"
ROUTED: dict[str, type[Message]] = {
    "/inference.v1.Inference/Generate": pb.GenerateRequest,
    "/inference.v1.Inference/GenerateImage": pb.GenerateImageRequest,
    "/inference.v1.Inference/Admit": pb.AdmitRequest,
}
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
        return RoutingInput(message.model, chained_blocks(generation_pieces(message)))
    if isinstance(message, pb.GenerateImageRequest):
        return RoutingInput(message.model or None)
    assert isinstance(message, pb.AdmitRequest)
    return RoutingInput(message.model)


def read_grpc_message(body: bytes, message_type: type[Message]) -> Message | None:
    """The one uncompressed message in a unary request body; None if it is not one."""
    if len(body) < 5:
        return None
    compressed, length = struct.unpack(">BI", body[:5])
    if compressed or len(body) != 5 + length:
        return None  # compressed, partial (past Envoy's buffer) or several messages
    message = message_type()
    try:
        message.ParseFromString(body[5:])
    except DecodeError:
        return None  # the replica answers INVALID_ARGUMENT
    return message


class _Request:
    """One request on its way through Envoy."""

    def __init__(self) -> None:
        self.message_type: type[Message] | None = None
        self.replica: Replica | None = None

    def release(self) -> None:
        if self.replica is not None:
            self.replica.routed -= 1
            self.replica = None


class EndpointPicker(ext_grpc.ExternalProcessorServicer):  # type: ignore[misc]  # untyped
    def __init__(self, monitor: ReplicaMonitor, table: PrefixTable, *, balance: int) -> None:
        self._monitor = monitor
        self._table = table
        self._balance = balance

    async def Process(
        self,
        request_iterator: AsyncIterator[ext.ProcessingRequest],
        context: grpc.aio.ServicerContext[ext.ProcessingRequest, ext.ProcessingResponse],
    ) -> AsyncIterator[ext.ProcessingResponse]:
        request = _Request()
        try:
            async for message in request_iterator:
                yield self._answer(message, request)
        finally:
            request.release()

    def _answer(self, message: ext.ProcessingRequest, request: _Request) -> ext.ProcessingResponse:
        kind = message.WhichOneof("request")
        if kind == "request_headers":
            return self._on_headers(message.request_headers, request)
        if kind == "request_body":
            return self._on_body(message.request_body, request)
        # Only request headers and bodies are configured; answer anything else unchanged.
        assert kind is not None
        return ext.ProcessingResponse(**{kind: _empty_answer(kind)})

    def _on_headers(self, headers: ext.HttpHeaders, request: _Request) -> ext.ProcessingResponse:
        path = _header(headers, ":path")
        request.message_type = ROUTED.get(path)
        mutation = _CLEAR_CLIENT_CHOICE
        if request.message_type is not None and headers.end_of_stream:
            mutation = self._route(None, request)  # no body at all: by load alone
        answer = ext.ProcessingResponse(
            request_headers=ext.HeadersResponse(
                response=ext.CommonResponse(header_mutation=mutation)
            )
        )
        if request.message_type is None:
            answer.mode_override.CopyFrom(_SKIP_BODY)  # not routed: Envoy balances it
        return answer

    def _on_body(self, body: ext.HttpBody, request: _Request) -> ext.ProcessingResponse:
        mutation = ext.HeaderMutation()
        if request.message_type is not None and request.replica is None:
            message = read_grpc_message(body.body, request.message_type)
            mutation = self._route(routing_input(message) if message else None, request)
        return ext.ProcessingResponse(
            request_body=ext.BodyResponse(response=ext.CommonResponse(header_mutation=mutation))
        )

    def _route(self, routing: RoutingInput | None, request: _Request) -> ext.HeaderMutation:
        blocks = routing.blocks if routing else []
        matched = self._table.matched_chars(blocks)
        model = routing.model if routing else None
        ranked = rank(self._monitor.replicas.values(), model, matched, balance=self._balance)
        if not ranked:
            return ext.HeaderMutation()  # nothing known to be up: Envoy balances it
        best = self._monitor.replicas[ranked[0]]
        best.routed += 1
        request.replica = best
        self._table.record(best.address, blocks)
        log.debug("routed", model=model, to=ranked, prefix_chars=matched.get(best.address, 0))
        value = ",".join(ranked).encode()
        return ext.HeaderMutation(
            set_headers=[
                base_pb2.HeaderValueOption(
                    header=base_pb2.HeaderValue(key=ENDPOINT_HEADER, raw_value=value),
                    append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
                )
            ]
        )


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


async def serve_picker(settings: PickerSettings) -> None:
    table = PrefixTable(settings.prefix_capacity)
    monitor = ReplicaMonitor(
        settings.replica,
        settings.replicas_dns,
        interval=settings.poll_interval,
        timeout=settings.poll_timeout,
        token=settings.replica_token.get_secret_value() if settings.replica_token else None,
        on_lost=table.forget,
    )
    server = grpc.aio.server()
    ext_grpc.add_ExternalProcessorServicer_to_server(
        EndpointPicker(monitor, table, balance=settings.balance), server
    )
    health_servicer = health.aio.HealthServicer()  # type: ignore[attr-defined]
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (ext.DESCRIPTOR.services_by_name["ExternalProcessor"].full_name, health.SERVICE_NAME),
        server,
    )
    port = server.add_insecure_port(settings.listen)
    if port == 0:
        raise SystemExit(f"cannot listen on {settings.listen}")
    await server.start()
    polling = asyncio.create_task(monitor.run())
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    host = settings.listen.rpartition(":")[0]
    log.info(
        "picking", address=f"{host}:{port}", replicas=settings.replica or settings.replicas_dns
    )
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    await stopping.wait()
    await health_servicer.enter_graceful_shutdown()
    await server.stop(settings.grace_period)
    polling.cancel()
    await asyncio.gather(polling, return_exceptions=True)


def main(argv: Sequence[str] | None = None) -> None:
    settings = load_picker_settings(argv)
    configure_logging(settings)
    asyncio.run(serve_picker(settings))


if __name__ == "__main__":
    main()
