"""Putting the Inference service on a grpc.aio server, with request decoding we control.

The generated `add_InferenceServicer_to_server` decodes requests with the
message classes' `FromString`, on the event loop, and a request that does not
decode (garbage bytes, invalid UTF-8 in a string field) fails inside grpc with
UNKNOWN, before any code of ours runs, unlogged and uncounted. Here:
- a small request is decoded at once, as before;
- a large one arrives as an `EncodedRequest`, decoded later off the event loop
  (a million chat messages take upb about 0.2 s, which every other stream
  would wait through);
- one that does not decode becomes an `UndecodableRequest`.
The RPC wrapper (`service.front.rpc`) finishes the job: it decodes what is still
encoded on its offload pool and answers what is undecodable with
INVALID_ARGUMENT, logged and counted like any other refused call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError, Message

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc

INFERENCE = pb.DESCRIPTOR.services_by_name["Inference"]
# Decoding this much takes upb well under a millisecond: not worth a thread hop.
INLINE_DECODE_BYTES = 64 * 1024


@dataclass(frozen=True)
class UndecodableRequest:
    """Stands in for a request message that could not be decoded."""

    message_type: str
    reason: str


@dataclass(frozen=True)
class EncodedRequest:
    """A request too large to decode on the event loop: `decode` it elsewhere."""

    message_class: type[Message]
    data: bytes

    def decode(self) -> Message | UndecodableRequest:
        return _decode(self.message_class, self.data)


def _decode(message_class: type[Message], data: bytes) -> Message | UndecodableRequest:
    try:
        return message_class.FromString(data)
    except DecodeError as exc:
        return UndecodableRequest(message_class.DESCRIPTOR.full_name, str(exc))


def _decoder(
    message_class: type[Message],
) -> Callable[[bytes], Message | UndecodableRequest | EncodedRequest]:
    def decode(data: bytes) -> Message | UndecodableRequest | EncodedRequest:
        if len(data) > INLINE_DECODE_BYTES:
            return EncodedRequest(message_class, data)
        return _decode(message_class, data)

    return decode


def add_inference_service(servicer: pb_grpc.InferenceServicer, server: grpc.aio.Server) -> None:
    """Serve `servicer`'s RPCs on `server`, as the generated code would but for decoding."""
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
    for method in INFERENCE.methods:
        request_class: type[Message] = getattr(pb, method.input_type.name)
        response_class: type[Message] = getattr(pb, method.output_type.name)
        handler: Callable[..., Any] = (
            grpc.unary_stream_rpc_method_handler
            if method.server_streaming
            else grpc.unary_unary_rpc_method_handler
        )
        handlers[method.name] = handler(
            getattr(servicer, method.name),
            request_deserializer=_decoder(request_class),
            response_serializer=response_class.SerializeToString,
        )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(INFERENCE.full_name, handlers),)
    )
    # grpc-stubs predates registered methods, hence the ignore.
    server.add_registered_method_handlers(INFERENCE.full_name, handlers)  # type: ignore[attr-defined]
