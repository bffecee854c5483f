"""The endpoint picker's Prometheus metrics: the picker serving on its ports as
`inference-picker` runs it, in front of stand-in replicas (health and ListModels
only) on loopback, asked by ext_proc streams as Envoy asks it, and scraped over
HTTP.

The picker polls once at start and then not for an hour, so what it knows of
the replicas, and the requests it counts on them since, decide every ranking.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import urllib.request
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc
from google.protobuf.message import Message
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from service.cluster.picker import ENDPOINT_HEADER, running_picker
from service.cluster.prompt_blocks import chained_blocks, generation_pieces
from service.cluster.replicas import INFERENCE_SERVICE
from service.cluster.settings import load_picker_settings

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


class StandIn(pb_grpc.InferenceServicer):
    """A replica as the picker sees it: its models and its load."""

    def __init__(self, models: tuple[str, ...], running: int, waiting: int) -> None:
        self._answer = pb.ListModelsResponse(
            models=[pb.ModelInfo(name=name, loaded=True, engine_pid=1) for name in models],
            default_model=models[0] if models else "",
            load=pb.ServerLoad(running=running, waiting=waiting),
        )

    async def ListModels(self, request: pb.ListModelsRequest, context: object) -> Message:
        return self._answer


@asynccontextmanager
async def stand_in(
    models: tuple[str, ...] = ("m",), *, serving: bool = True, running: int = 3, waiting: int = 2
) -> AsyncIterator[str]:
    server = grpc.aio.server()
    pb_grpc.add_InferenceServicer_to_server(StandIn(models, running, waiting), server)
    health_servicer = health.aio.HealthServicer()  # type: ignore[attr-defined]
    answer = health_pb2.HealthCheckResponse
    await health_servicer.set(INFERENCE_SERVICE, answer.SERVING if serving else answer.NOT_SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


def closed_port() -> str:
    """An address nothing listens on: the picker's poll is refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


@asynccontextmanager
async def picker(*replicas: str) -> AsyncIterator[tuple[ext_grpc.ExternalProcessorStub, int]]:
    """The picker (balance 0, polling once), its ext_proc stub and its metrics port."""
    argv = ["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"]
    argv += ["--poll-interval", "3600", "--balance", "0", "--tie-seed", "1"]
    argv += ["--grace-period", "0"]
    for address in replicas:
        argv += ["--replica", address]
    async with AsyncExitStack() as stack:
        running = await stack.enter_async_context(running_picker(load_picker_settings(argv)))
        await running.monitor.refreshed.wait()
        channel = await stack.enter_async_context(
            grpc.aio.insecure_channel(f"127.0.0.1:{running.port}")
        )
        assert running.metrics_port
        yield ext_grpc.ExternalProcessorStub(channel), running.metrics_port


async def ask(
    stub: ext_grpc.ExternalProcessorStub, method: str, request: Message, *, compressed: int = 0
) -> list[str]:
    """Send one request's body as Envoy does; the replicas the picker named, best first."""
    payload = request.SerializeToString()
    message = ext.ProcessingRequest()
    message.request_body.body = struct.pack(">BI", compressed, len(payload)) + payload
    message.request_body.end_of_stream = True
    call = stub.Process(iter([message]), metadata=(("x-inference-method", method),))
    answers = [answer async for answer in call]
    (answer,) = answers
    for header in answer.request_body.response.header_mutation.set_headers:
        if header.header.key == ENDPOINT_HEADER:
            return str(header.header.raw_value.decode()).split(",")
    return []


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def decisions(samples: Samples) -> dict[tuple[str, str], float]:
    """The decisions counted, by (method, reason), leaving out those still at 0."""
    return {
        (dict(labels)["method"], dict(labels)["reason"]): value
        for (name, labels), value in samples.items()
        if name == "inference_picker_decisions_total" and value
    }


def conversation(*texts: str) -> pb.GenerateRequest:
    roles = ("user", "assistant")
    return pb.GenerateRequest(
        model="m",
        messages=[pb.ChatMessage(role=roles[i % 2], content=t) for i, t in enumerate(texts)],
    )


def test_decisions_are_counted_by_reason_and_the_replicas_up_are_shown() -> None:
    first = conversation("You are terse. " * 20, "Name a colour.")
    second = conversation("You are terse. " * 20, "Name a colour.", "Blue.", "Another?")
    cached_chars = chained_blocks(generation_pieces(first), model="m")[-1].end
    second_chars = chained_blocks(generation_pieces(second), model="m")[-1].end

    async def scenario() -> tuple[list[list[str]], Samples, str, str, str, str]:
        async with (
            stand_in(("m",)) as a,
            stand_in(("m", "x")) as b,
            stand_in(("m",), serving=False) as c,
        ):
            d = closed_port()
            async with picker(a, b, c, d) as (stub, metrics_port):
                named = [
                    # only B has x: model placement (B is counted one busier from now)
                    await ask(stub, "Generate", pb.GenerateRequest(model="x", prompt="Hi")),
                    # neither was sent this prompt: A is less loaded
                    await ask(stub, "Generate", first),
                    # its next turn: A was sent its beginning, and A is as busy as B
                    await ask(stub, "Generate", second),
                    # again: A is now one busier than B, beyond --balance 0
                    await ask(stub, "Generate", second),
                    await ask(stub, "Admit", pb.AdmitRequest(model="x")),
                    # a compressed body is not read: load alone (A 7, B 8)
                    await ask(stub, "Generate", first, compressed=1),
                ]
                samples = await asyncio.to_thread(scrape, metrics_port)
        return named, samples, a, b, c, d

    named, samples, a, b, c, d = asyncio.run(scenario())
    assert [order[0] for order in named] == [b, a, a, b, b, a]
    assert all(set(order) == {a, b} for order in named), "down replicas are never named"
    assert decisions(samples) == {
        ("Generate", "model"): 1,
        ("Generate", "least_loaded"): 2,
        ("Generate", "prefix"): 1,
        ("Generate", "balance"): 1,
        ("Admit", "model"): 1,
    }
    assert samples[("inference_picker_decision_duration_seconds_count", ())] == 6
    assert samples[("inference_picker_unread_bodies_total", (("method", "Generate"),))] == 1
    assert samples[("inference_picker_prefix_hit_chars_total", ())] == cached_chars
    # Generate prompts routed by what they say: "Hi", first, second twice
    prompt_chars = len("Hi") + cached_chars + 2 * second_chars
    assert samples[("inference_picker_prompt_chars_total", ())] == prompt_chars
    assert samples[("inference_picker_prefix_blocks", ())] > 0
    assert samples[("inference_picker_prefix_capacity", ())] == 200_000

    assert samples[("inference_picker_replicas_up", ())] == 2
    assert samples[("inference_picker_replicas", ())] == 4
    up = {dict(labels)["replica"]: value for (name, labels), value in samples.items()
          if name == "inference_picker_replica_up"}  # fmt: skip
    assert up == {a: 1, b: 1, c: 0, d: 0}
    assert samples[("inference_picker_replica_load", (("replica", a),))] == 5  # 3 + 2
    polls = {dict(labels)["outcome"]: value for (name, labels), value in samples.items()
             if name == "inference_picker_poll_duration_seconds_count"}  # fmt: skip
    assert polls == {"SERVING": 2, "NOT_SERVING": 1, "UNAVAILABLE": 1}


def test_with_no_replica_up_the_picker_names_none_and_counts_it() -> None:
    async def scenario() -> tuple[list[str], Samples]:
        async with picker(closed_port()) as (stub, metrics_port):
            named = await ask(stub, "Generate", conversation("Hello"))
            return named, await asyncio.to_thread(scrape, metrics_port)

    named, samples = asyncio.run(scenario())
    assert named == []  # Envoy balances it itself
    assert decisions(samples) == {("Generate", "no_replica"): 1}
    assert samples[("inference_picker_replicas_up", ())] == 0
    assert samples[("inference_picker_replicas", ())] == 1
    assert samples[("inference_picker_prompt_chars_total", ())] == 0


def test_the_health_listener_answers_health_alone_on_its_own_port() -> None:
    """--health-listen: what a kubelet's grpc probe asks while --listen is on loopback."""

    async def scenario() -> tuple[int, int, str, grpc.StatusCode]:
        argv = ["--listen", "127.0.0.1:0", "--health-listen", "127.0.0.1:0"]
        argv += ["--poll-interval", "3600", "--grace-period", "0", "--replica", closed_port()]
        async with (
            running_picker(load_picker_settings(argv)) as running,
            grpc.aio.insecure_channel(f"127.0.0.1:{running.health_port}") as channel,
        ):
            assert running.health_port is not None
            answer = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=5
            )
            call = ext_grpc.ExternalProcessorStub(channel).Process(iter([]), timeout=5)
            try:
                _ = [message async for message in call]
                refused = grpc.StatusCode.OK
            except grpc.aio.AioRpcError as exc:
                refused = exc.code()
            status = health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)
            return running.port, running.health_port, status, refused

    port, health_port, status, refused = asyncio.run(scenario())
    assert health_port != port
    assert status == "SERVING"
    assert refused == grpc.StatusCode.UNIMPLEMENTED, "ext_proc stays on --listen"
