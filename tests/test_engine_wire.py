"""The engine contract's encoding: frames, requests and outcomes survive the crossing."""

from __future__ import annotations

import asyncio
import socket
import struct

import grpc
import pytest

from inference.engine.v1 import engine_pb2 as epb
from inference.v1 import inference_pb2 as pb
from service import errors
from service.engine import wire
from service.engine.framing import BlockingLink, FrameError, encode, read_message
from service.engine.model_options import ModelOptions
from service.engine.options import EngineOptions
from service.front.conversion import generation_request
from service.images.requests import ImageLimits, ImageRequest
from service.text.requests import GenerationLimits, ToolChoice

ERRORS = [
    errors.InvalidRequest,
    errors.ModelNotFound,
    errors.NotSupported,
    errors.AccessDenied,
    errors.Overloaded,
    errors.Unavailable,
    errors.TimedOut,
    errors.BackendFailure,
]


@pytest.mark.parametrize("kind", ERRORS, ids=lambda kind: kind.__name__)
def test_a_service_error_keeps_its_status_and_words(kind: type[errors.ServiceError]) -> None:
    back = wire.error_of(wire.status_of(kind("the model's cache is full")))
    assert type(back) is kind
    assert back.message == "the model's cache is full"


def test_a_bug_crosses_as_internal_with_a_generic_message() -> None:
    status = wire.status_of(TypeError("secret detail"))
    assert status.code == grpc.StatusCode.INTERNAL.value[0]
    assert "secret detail" not in status.message
    assert wire.error_of(status).code == grpc.StatusCode.INTERNAL


def test_a_clean_end_is_ok() -> None:
    assert wire.status_of(None).code == wire.OK


def test_a_generation_request_crosses_with_its_grammar_compiled_once() -> None:
    message = pb.GenerateRequest(
        model="m",
        messages=[pb.ChatMessage(role="user", content="Name a colour.")],
        max_tokens=5,
        temperature=0.5,
        stop=["\n"],
        response_format=pb.ResponseFormat(json_schema='{"type": "string", "maxLength": 8}'),
        logprobs=True,
        top_logprobs=3,
    )
    request = generation_request(message)
    assert request.grammar is not None
    generate = wire.generate_message(7, request, 12.5, request_id="trace-1").generate
    crossed = wire.generation_request(generate)
    assert crossed == request
    assert crossed.grammar == request.grammar
    assert (generate.id, generate.request_id) == (7, "trace-1")


def test_the_engine_takes_the_front_s_request_without_checking_it_again() -> None:
    """The socket carries the engine's TextRequest: the compiled grammar and no
    response_format; a value the front's settings allowed (more top_logprobs than
    the default limit, a tool turn with its call) crosses unchanged."""
    call = pb.ToolCall(id="call_1", name="f", arguments_json='{"x": 1}')
    message = pb.GenerateRequest(
        messages=[
            pb.ChatMessage(role="user", content="Hi"),
            pb.ChatMessage(role="assistant", tool_calls=[call]),
            pb.ChatMessage(role="tool", tool_call_id="call_1", name="f", content="2"),
        ],
        tools=[pb.Tool(name="f", parameters_json='{"type": "object"}')],
        logprobs=True,
        top_logprobs=50,
        seed=0,
        top_k=0,
    )
    request = generation_request(message, GenerationLimits(max_top_logprobs=64))
    text = wire.generate_message(1, request, 0.0, request_id="r").generate.text
    assert not text.HasField("prompt")
    assert not text.HasField("grammar")
    # Zeros the client set stay set: an unset field would mean the model's default.
    assert text.sampling.HasField("seed")
    assert text.sampling.HasField("top_k")
    assert not text.sampling.HasField("temperature")
    crossed = wire.generation_request(epb.Generate(text=text))
    assert crossed == request
    assert crossed.top_logprobs == 50
    assert crossed.tool_choice is None


@pytest.mark.parametrize("choice", [pb.ToolChoice(), pb.ToolChoice(name="f", parallel_calls=True)])
def test_a_forced_tool_call_crosses_for_the_engine_to_build_its_grammar(
    choice: pb.ToolChoice,
) -> None:
    message = pb.GenerateRequest(
        prompt="Hi", tools=[pb.Tool(name="f"), pb.Tool(name="g")], tool_choice=choice
    )
    request = generation_request(message)
    text = wire.generate_message(1, request, 0.0, request_id="r").generate.text
    assert text.HasField("tool_choice")
    assert not text.HasField("grammar")  # the front cannot build it: the template decides
    crossed = wire.generation_request(epb.Generate(text=text))
    assert crossed == request
    assert crossed.tool_choice == ToolChoice(choice.name, choice.parallel_calls)


def test_an_image_request_crosses_with_its_seed() -> None:
    limits = ImageLimits(1024, 1024, 50)
    request = ImageRequest.from_pb(
        pb.GenerateImageRequest(model="tiny-sd", prompt="a fox", width=64), limits
    )
    image = wire.image_message(3, request, 1.0, request_id="trace-2").generate_image
    assert wire.image_request(image) == request
    assert (image.id, image.request_id) == (3, "trace-2")


@pytest.mark.parametrize("batch_size", [None, 768])
def test_engine_options_cross_whole(batch_size: int | None) -> None:
    model = ModelOptions(
        context_size=512, threads=2, gpu_layers=0, main_gpu=1, flash_attention="off",
        parallel_sequences=3, cached_sequences=0, kv_layout="per-sequence", stream_interval=4,
        batch_size=batch_size,
    )  # fmt: skip
    options = EngineOptions(
        name="m", backend="llama.cpp", path=__import__("pathlib").Path("/m.gguf"), model=model,
        chat_template="{{ messages }}", max_decode_seconds=None,
    )  # fmt: skip
    assert EngineOptions.from_pb(options.to_pb()) == options


def test_frames_cross_a_socket_in_order() -> None:
    engine_end, front_end = socket.socketpair()
    link = BlockingLink(engine_end)
    batch = epb.EventBatch(events=[epb.Event(id=n) for n in range(3)], running=2)
    link.send(epb.FromEngine(events=batch))
    link.send(epb.FromEngine(model_failed="gone"))
    link.close()

    async def read_all() -> list[epb.FromEngine]:
        reader, writer = await asyncio.open_unix_connection(sock=front_end)
        messages = []
        while (message := await read_message(reader, epb.FromEngine)) is not None:
            messages.append(message)
        writer.close()
        return messages

    first, second = asyncio.run(read_all())
    assert [event.id for event in first.events.events] == [0, 1, 2]
    assert second.model_failed == "gone"


def test_a_frame_longer_than_any_we_send_is_refused() -> None:
    async def read() -> None:
        reader = asyncio.StreamReader()
        reader.feed_data(struct.pack(">I", 0xFFFFFFFF))
        await read_message(reader, epb.FromEngine)

    with pytest.raises(FrameError):
        asyncio.run(read())
    assert len(encode(epb.ToEngine(cancel=epb.Cancel(id=1)))) > 4
