"""The endpoint picker's parts, without processes: prompt blocks, the prefix
table, the ranking, reading a request body (gRPC or OpenAI JSON), its ext_proc
answers, and the Envoy configuration it works with (checked by the real Envoy
binary)."""

from __future__ import annotations

import asyncio
import json
import random
import struct
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext

from inference.v1 import inference_pb2 as pb
from service.cluster.envoy_config import layout_from_args, render
from service.cluster.metrics import PickerMetrics
from service.cluster.picker import (
    ENDPOINT_HEADER,
    ROUTED,
    EndpointPicker,
    read_grpc_message,
    read_json_body,
    routing_input,
)
from service.cluster.prefix_table import PrefixTable
from service.cluster.prompt_blocks import chained_blocks, generation_pieces
from service.cluster.ranking import rank, ranked
from service.cluster.replicas import Replica, ReplicaMonitor, parse_replica
from service.cluster.settings import load_picker_settings

A, B, C = "10.0.0.1:50051", "10.0.0.2:50051", "10.0.0.3:50051"


class Context:
    """What the picker reads of its ServicerContext: the stream's metadata."""

    def __init__(self, method: str = "") -> None:
        self._metadata = (("x-inference-method", method),) if method else ()

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata


def context(method: str = "") -> Any:
    return cast(Any, Context(method))


def chat(*texts: str) -> pb.GenerateRequest:
    roles = ("user", "assistant")
    return pb.GenerateRequest(
        messages=[pb.ChatMessage(role=roles[i % 2], content=t) for i, t in enumerate(texts)]
    )


def blocks_of(request: pb.GenerateRequest):
    return chained_blocks(generation_pieces(request))


def replica(address: str, *, load: int = 0, models: tuple[str, ...] = ("m",), **kw) -> Replica:
    found = Replica(address, up=True, default_model="m", **kw)
    found.engines = dict.fromkeys(models, 1)
    found.running = load
    return found


# --- prompt blocks and the prefix table ------------------------------------------


def test_the_next_turn_repeats_every_block_of_the_previous_one() -> None:
    first = blocks_of(chat("Name a colour.", "Blue.", "Another?"))
    second = blocks_of(chat("Name a colour.", "Blue.", "Another?", "Red.", "And one more?"))
    assert [b.digest for b in second[: len(first)]] == [b.digest for b in first]
    assert second[len(first)].digest not in {b.digest for b in first}


def test_long_text_is_cut_into_blocks_that_cover_what_came_before() -> None:
    shared = "x" * 200
    one = chained_blocks([shared + "tail one"])
    two = chained_blocks([shared + "tail two"])
    assert [b.end for b in one] == [64, 128, 192, 208]
    assert [b.digest for b in one[:3]] == [b.digest for b in two[:3]]
    assert one[3].digest != two[3].digest


def test_message_boundaries_are_part_of_the_text() -> None:
    assert blocks_of(chat("ab", "c"))[-1].digest != blocks_of(chat("a", "bc"))[-1].digest


def test_the_table_finds_the_longest_prefix_each_replica_was_sent() -> None:
    table = PrefixTable()
    short = blocks_of(chat("Hello"))
    longer = blocks_of(chat("Hello", "Hi!", "How are you?"))
    table.record(A, short)
    table.record(B, longer)
    matched = table.matched_chars(blocks_of(chat("Hello", "Hi!", "How are you?", "Fine.")))
    assert matched[B] > matched[A] > 0
    assert C not in matched


def test_the_table_forgets_the_oldest_blocks_and_lost_replicas() -> None:
    table = PrefixTable(capacity=2)
    table.record(A, chained_blocks(["a" * 200]))  # 4 blocks, only the last 2 kept
    assert len(table) == 2
    assert table.matched_chars(chained_blocks(["a" * 200])) == {}  # the first block is gone
    table = PrefixTable()
    table.record(A, short := chained_blocks(["hello"]))
    table.record(B, short)
    table.forget(A)
    assert table.matched_chars(short) == {B: 5}


# --- ranking ------------------------------------------------------------------------


def test_replicas_that_are_down_are_never_named() -> None:
    down = replica(A)
    down.up = False
    assert rank([down, replica(B)], "m", {}) == [B]
    assert rank([down], "m", {}) == []


def test_a_loaded_model_beats_a_less_busy_replica_that_would_load_it() -> None:
    assert rank([replica(A, load=3, models=("x",)), replica(B)], "x", {})[0] == A


def test_the_default_model_is_loaded_where_the_replica_says_it_is() -> None:
    assert rank([replica(A, load=2), replica(B, load=1, models=())], "", {})[0] == A


def test_a_cached_prefix_wins_within_the_balance_and_loses_beyond_it() -> None:
    replicas = [replica(A, load=3), replica(B, load=0)]
    assert rank(replicas, "m", {A: 500}, balance=8)[0] == A
    assert rank(replicas, "m", {A: 500}, balance=2)[0] == B


def test_a_replica_at_its_limit_goes_last() -> None:
    full = replica(A, load=1, max_running=1, max_waiting=0)
    assert full.saturated
    assert rank([full, replica(B, load=5, models=())], "m", {A: 500}) == [B, A]


def test_requests_the_picker_routed_count_before_the_next_poll() -> None:
    busy = replica(A)
    busy.routed = 4
    assert busy.load == 4
    assert rank([busy, replica(B, load=1)], "m", {})[0] == B
    monitor = ReplicaMonitor()
    monitor._update(busy, pb.ListModelsResponse(load=pb.ServerLoad(running=3)))
    assert busy.load == 3  # the poll's count includes them


def test_a_cold_model_goes_to_the_least_busy_replica() -> None:
    assert rank([replica(A, load=2), replica(B, load=1), replica(C, load=3)], "new", {}) == [
        B,
        A,
        C,
    ]


def test_the_ranking_says_which_step_put_the_first_replica_first() -> None:
    def reason(*replicas: Replica, model: str | None = "m", **matched: int) -> str:
        by_address = {"A": A, "B": B, "C": C}
        chars = {by_address[name]: n for name, n in matched.items()}
        return ranked(replicas, model, chars, balance=2).reason

    down = replica(A)
    down.up = False
    assert reason() == reason(down) == "no_replica"
    assert reason(replica(A, load=9), down) == "only_replica"

    def full(address: str) -> Replica:
        return replica(address, load=1, max_running=1, max_waiting=0)

    assert reason(full(A), full(B)) == "saturated"
    assert reason(full(A), replica(B, load=5)) == "room"
    assert reason(replica(A, load=3, models=("x",)), replica(B), model="x") == "model"
    assert reason(replica(A, load=2), replica(B), A=500, B=64) == "prefix"
    assert reason(replica(A, load=3), replica(B), A=500) == "balance"  # 3 > 0 + balance
    assert reason(replica(A, load=3), replica(B, load=1)) == "least_loaded"
    assert reason(replica(A, load=1), replica(B, load=1), model=None) == "tie"
    # the winner's own prefix, not a longer one beyond the balance, decided
    assert reason(replica(A, load=9), replica(B), replica(C, load=1), A=900, B=64) == "prefix"
    # a cached prefix on a replica without the model is no reason: the model decided
    assert reason(replica(A, models=("x",)), replica(B, load=5), model="x", B=500) == "model"


def test_a_replaced_engine_or_a_replica_back_up_forgets_its_cache() -> None:
    lost: list[str] = []
    monitor = ReplicaMonitor(on_lost=lost.append)
    seen = Replica(A)
    answer = pb.ListModelsResponse(
        models=[pb.ModelInfo(name="m", loaded=True, engine_pid=7)], default_model="m"
    )
    monitor._update(seen, answer)  # up again
    monitor._update(seen, answer)  # nothing changed
    answer.models[0].engine_pid = 8
    monitor._update(seen, answer)  # the engine was replaced
    assert lost == [A, A]


def test_a_slow_replica_stays_up_until_it_is_slow_three_times_and_a_refusal_counts_at_once() -> (
    None
):
    lost: list[str] = []
    monitor = ReplicaMonitor(on_lost=lost.append)
    slow, gone = replica(A), replica(B)
    for _ in range(2):
        monitor._failed_poll(slow, grpc.StatusCode.DEADLINE_EXCEEDED)
    assert slow.up
    monitor._failed_poll(slow, grpc.StatusCode.DEADLINE_EXCEEDED)
    assert not slow.up
    monitor._failed_poll(gone, grpc.StatusCode.UNAVAILABLE)
    assert not gone.up
    assert lost == [A, B]


# --- the request body and the ext_proc answers -----------------------------------------


def frame(message: pb.GenerateRequest, *, compressed: int = 0) -> bytes:
    payload = message.SerializeToString()
    return struct.pack(">BI", compressed, len(payload)) + payload


def test_a_request_body_is_read_whole_or_as_far_as_it_arrived() -> None:
    request = chat("Name a colour.", "Blue.", "Another?")
    request.model = "m"
    whole = frame(request)
    assert read_grpc_message(whole, pb.GenerateRequest) == request
    cut = read_grpc_message(whole[:-3], pb.GenerateRequest)  # inside the last message
    assert isinstance(cut, pb.GenerateRequest)
    assert cut.model == "m"
    assert [m.content for m in cut.messages] == ["Name a colour.", "Blue."]
    assert read_grpc_message(frame(request, compressed=1), pb.GenerateRequest) is None
    assert read_grpc_message(b"\x00\x00", pb.GenerateRequest) is None


def test_a_body_that_is_not_the_message_it_claims_is_not_read() -> None:
    # field 1 says "string" but holds bytes that are not UTF-8
    garbage = b"\x0a\x02\xff\xfe"
    body = struct.pack(">BI", 0, len(garbage)) + garbage
    assert read_grpc_message(body, pb.GenerateRequest) is None


class Monitor:
    def __init__(self, *replicas: Replica) -> None:
        self.replicas = {r.address: r for r in replicas}


def headers_message(path: str) -> ext.ProcessingRequest:
    message = ext.ProcessingRequest()
    message.request_headers.headers.headers.add(key=":path", raw_value=path.encode())
    return message


def body_message(request: pb.GenerateRequest) -> ext.ProcessingRequest:
    message = ext.ProcessingRequest()
    message.request_body.body = frame(request)
    message.request_body.end_of_stream = True
    return message


async def feed(
    messages: tuple[ext.ProcessingRequest, ...],
) -> AsyncIterator[ext.ProcessingRequest]:
    for message in messages:
        yield message


async def exchange(
    picker: EndpointPicker, method: str, *messages: ext.ProcessingRequest
) -> list[ext.ProcessingResponse]:
    return [answer async for answer in picker.Process(feed(messages), context(method))]


def test_a_generate_request_is_sent_to_the_ranked_replicas_and_counted_at_once() -> None:
    busy, idle = replica(A, load=2), replica(B)
    picker = EndpointPicker(Monitor(busy, idle), PrefixTable(), balance=8)  # type: ignore[arg-type]
    body = body_message(pb.GenerateRequest(prompt="Hi"))

    (on_body,) = asyncio.run(exchange(picker, "Generate", body))
    (chosen,) = on_body.request_body.response.header_mutation.set_headers
    assert chosen.header.key == ENDPOINT_HEADER
    assert chosen.header.raw_value == f"{B},{A}".encode()
    assert idle.routed == 1  # counted until the next poll reports it


def test_an_admit_body_is_read_as_an_admit_request() -> None:
    cold, warm = replica(A, models=()), replica(B, load=3, models=("x",))
    picker = EndpointPicker(Monitor(cold, warm), PrefixTable(), balance=8)  # type: ignore[arg-type]
    admit = pb.AdmitRequest(model="x")
    payload = admit.SerializeToString()
    body = ext.ProcessingRequest()
    body.request_body.body = struct.pack(">BI", 0, len(payload)) + payload
    (answer,) = asyncio.run(exchange(picker, "Admit", body))
    (chosen,) = answer.request_body.response.header_mutation.set_headers
    assert chosen.header.raw_value.startswith(B.encode())


def test_with_headers_sent_too_the_path_names_the_method() -> None:
    picker = EndpointPicker(Monitor(replica(A)), PrefixTable(), balance=8)  # type: ignore[arg-type]
    on_headers, on_body = asyncio.run(
        exchange(
            picker,
            "",
            headers_message("/inference.v1.Inference/Generate"),
            body_message(pb.GenerateRequest(prompt="Hi")),
        )
    )
    assert on_headers.request_headers.response.header_mutation.remove_headers == [ENDPOINT_HEADER]
    assert not on_headers.HasField("mode_override")
    assert on_body.request_body.response.header_mutation.set_headers


def test_other_methods_skip_the_body_and_are_left_to_envoy() -> None:
    picker = EndpointPicker(Monitor(replica(A)), PrefixTable(), balance=8)  # type: ignore[arg-type]
    path = "/inference.v1.Inference/ListModels"
    (answer,) = asyncio.run(exchange(picker, "", headers_message(path)))
    assert answer.mode_override.request_body_mode == answer.mode_override.NONE
    assert not answer.request_headers.response.header_mutation.set_headers


def test_a_body_of_an_unknown_method_is_left_to_envoy() -> None:
    picker = EndpointPicker(Monitor(replica(A)), PrefixTable(), balance=8)  # type: ignore[arg-type]
    (answer,) = asyncio.run(exchange(picker, "", body_message(pb.GenerateRequest(prompt="Hi"))))
    assert not answer.request_body.response.header_mutation.set_headers


# --- OpenAI-compatible HTTP: the JSON body, the replicas' HTTP ports -----------------


def json_body(**fields: object) -> bytes:
    return json.dumps(fields).encode()


CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Name a colour."},
    {"role": "assistant", "content": "Blue."},
    {"role": "user", "content": [{"type": "text", "text": "Another?"}]},
]


def test_a_chat_body_gives_its_model_and_its_messages_as_the_replica_reads_them() -> None:
    request = read_json_body(json_body(model="x", messages=CONVERSATION), "ChatCompletions")
    assert request is not None
    assert request.model == "x"
    assert [(m.role, m.content) for m in request.messages] == [
        ("system", "Be brief."),
        ("user", "Name a colour."),
        ("assistant", "Blue."),
        ("user", "Another?"),  # text parts joined, as the replica joins them
    ]
    no_model = read_json_body(json_body(messages=CONVERSATION), "ChatCompletions")
    assert no_model is not None
    assert routing_input(no_model).model == ""  # the replica's default model, as over gRPC


def test_a_completions_body_gives_its_prompt() -> None:
    request = read_json_body(json_body(model="x", prompt="Once upon a time"), "Completions")
    assert request is not None
    assert (request.model, request.prompt) == ("x", "Once upon a time")
    listed = read_json_body(json_body(prompt=["Once"]), "Completions")
    assert listed is not None
    assert listed.prompt == "Once"


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b'{"messages": [{"role": "user", "content": "cut sho',  # past the buffer limit
        b"\xff\xfe",
        b'["a list"]',
        json_body(messages=CONVERSATION, n=129),  # the replica refuses it wherever it goes
        json_body(messages=[]),
        b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",  # nested without end
        b'{"messages": [{"role": "user", "content": "hi"}], "top_p": 1' + b"0" * 400 + b"}",
    ],
)
def test_a_body_that_is_not_json_the_replica_takes_is_not_read(body: bytes) -> None:
    assert read_json_body(body, "ChatCompletions") is None


def test_a_conversation_hashes_alike_over_grpc_and_over_http() -> None:
    """The same turns sent as a gRPC GenerateRequest and as OpenAI JSON are the same
    prompt blocks: the replica that cached one has the other's prefix."""
    over_grpc = pb.GenerateRequest(
        model="x",
        messages=[
            pb.ChatMessage(role="system", content="Be brief."),
            pb.ChatMessage(role="user", content="Name a colour."),
            pb.ChatMessage(role="assistant", content="Blue."),
            pb.ChatMessage(role="user", content="Another?"),
        ],
        max_tokens=8,
    )
    over_http = read_json_body(
        json_body(model="x", messages=CONVERSATION, max_tokens=8, stream=True), "ChatCompletions"
    )
    assert over_http is not None
    assert routing_input(over_http).blocks == routing_input(over_grpc).blocks
    prompt = read_json_body(json_body(model="x", prompt="Once"), "Completions")
    assert prompt is not None
    assert (
        routing_input(prompt).blocks
        == routing_input(pb.GenerateRequest(model="x", prompt="Once")).blocks
    )


def http_body_message(body: bytes) -> ext.ProcessingRequest:
    message = ext.ProcessingRequest()
    message.request_body.body = body
    message.request_body.end_of_stream = True
    return message


def test_an_http_request_is_sent_to_the_ranked_replicas_http_ports() -> None:
    busy = replica(A, load=2, http_port=8080)
    idle = replica(B, http_port=8081)
    no_http = replica(C)  # its HTTP port unknown: never named for HTTP
    metrics = PickerMetrics(lambda: (), methods=ROUTED, prefix_capacity=10)
    picker = EndpointPicker(
        Monitor(busy, idle, no_http),  # type: ignore[arg-type]
        PrefixTable(),
        balance=8,
        metrics=metrics,
    )
    body = http_body_message(json_body(messages=CONVERSATION))
    (answer,) = asyncio.run(exchange(picker, "ChatCompletions", body))
    (chosen,) = answer.request_body.response.header_mutation.set_headers
    assert chosen.header.key == ENDPOINT_HEADER
    assert chosen.header.raw_value == b"10.0.0.2:8081,10.0.0.1:8080"
    assert idle.routed == 1  # the replica, whichever port it was sent to
    decided = metrics.registry.get_sample_value(
        "inference_picker_decisions_total", {"method": "ChatCompletions", "reason": "least_loaded"}
    )
    assert decided == 1


def test_an_http_conversation_goes_where_its_grpc_beginning_went() -> None:
    first, second = replica(A, http_port=8080), replica(B, http_port=8081)
    table = PrefixTable()
    picker = EndpointPicker(Monitor(first, second), table, balance=8)  # type: ignore[arg-type]
    over_grpc = pb.GenerateRequest(
        messages=[
            pb.ChatMessage(role=m["role"], content=str(m["content"])) for m in CONVERSATION[:3]
        ]
    )
    (on_grpc,) = asyncio.run(exchange(picker, "Generate", body_message(over_grpc)))
    home = on_grpc.request_body.response.header_mutation.set_headers[0].header.raw_value
    home_http = {A.encode(): b"10.0.0.1:8080", B.encode(): b"10.0.0.2:8081"}[home.split(b",")[0]]
    other = second if home.startswith(A.encode()) else first
    other.routed = 3  # busier than the home, and without the prefix: the prefix wins
    (on_http,) = asyncio.run(
        exchange(picker, "ChatCompletions", http_body_message(json_body(messages=CONVERSATION)))
    )
    chosen = on_http.request_body.response.header_mutation.set_headers[0].header.raw_value
    assert chosen.split(b",")[0] == home_http


def test_with_headers_sent_too_an_http_path_names_the_method() -> None:
    picker = EndpointPicker(Monitor(replica(A, http_port=8080)), PrefixTable(), balance=8)  # type: ignore[arg-type]
    on_headers, on_body = asyncio.run(
        exchange(
            picker,
            "",
            headers_message("/v1/completions?api-version=1"),
            http_body_message(json_body(prompt="Hi")),
        )
    )
    assert on_headers.request_headers.response.header_mutation.remove_headers == [ENDPOINT_HEADER]
    (chosen,) = on_body.request_body.response.header_mutation.set_headers
    assert chosen.header.raw_value == b"10.0.0.1:8080"
    (models,) = asyncio.run(exchange(picker, "", headers_message("/v1/models")))
    assert models.mode_override.request_body_mode == models.mode_override.NONE


def test_a_non_json_http_body_is_ranked_by_load_alone_and_counted_unread() -> None:
    metrics = PickerMetrics(lambda: (), methods=ROUTED, prefix_capacity=10)
    busy, idle = replica(A, load=2, http_port=8080), replica(B, http_port=8081)
    picker = EndpointPicker(
        Monitor(busy, idle),  # type: ignore[arg-type]
        PrefixTable(),
        balance=8,
        metrics=metrics,
    )
    (answer,) = asyncio.run(exchange(picker, "Completions", http_body_message(b"prompt=Hi")))
    (chosen,) = answer.request_body.response.header_mutation.set_headers
    assert chosen.header.raw_value.startswith(b"10.0.0.2:8081")
    unread = metrics.registry.get_sample_value(
        "inference_picker_unread_bodies_total", {"method": "Completions"}
    )
    assert unread == 1


def test_a_replica_names_its_http_port_after_an_equals_sign() -> None:
    assert parse_replica("10.0.0.1:50051") == ("10.0.0.1:50051", None)
    assert parse_replica("10.0.0.1:50051=8080") == ("10.0.0.1:50051", 8080)
    assert parse_replica("replicas.svc:50051=8080") == ("replicas.svc:50051", 8080)
    assert Replica("[::1]:50051", http_port=8080).http_address == "[::1]:8080"
    assert Replica(A).http_address is None
    for wrong in ("10.0.0.1:50051=", "10.0.0.1:50051=http", "10.0.0.1=8080", "h:1=70000"):
        with pytest.raises(ValueError, match="expected HOST:PORT"):
            parse_replica(wrong)
    with pytest.raises(ValueError, match="HTTP_PORT"):
        load_picker_settings(["--replica", "10.0.0.1:50051=http"])


# --- the Envoy configuration ---------------------------------------------------------


@pytest.mark.parametrize(
    "arguments",
    [
        ["--replica", "127.0.0.1:50061", "--replica", "127.0.0.1:50062"],
        ["--replicas-dns", "inference-replicas.inference.svc.cluster.local:50051"],
        ["--replica", "127.0.0.1:50061", "--picker", "none"],
        [
            *("--replica", "127.0.0.1:50100=50200", "--replica", "127.0.0.1:50101=50201"),
            *("--http-listen", "127.0.0.1:50061"),
        ],
        ["--replicas-dns", "replicas.svc:50051=8080", "--http-listen", "0.0.0.0:8080"],
        ["--replica", "127.0.0.1:50100=50200", "--http-listen", "[::1]:8080", "--picker", "none"],
    ],
)
def test_envoy_accepts_the_rendered_configuration(tmp_path: Path, arguments: list[str]) -> None:
    config = tmp_path / "envoy.yaml"
    config.write_text(render(layout_from_args(arguments)))
    envoy = Path(sys.executable).with_name("envoy")
    checked = subprocess.run(
        [str(envoy), "--mode", "validate", "-c", str(config), "--log-level", "error"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stderr
    assert "OK" in checked.stdout + checked.stderr


def test_the_configuration_names_every_replica_and_the_picker_only_when_there_is_one() -> None:
    with_picker = render(layout_from_args(["--replica", A, "--replica", B]))
    assert with_picker.count("port_value: 50051") == 2
    assert "envoy.filters.http.ext_proc" in with_picker
    assert "type: STATIC" in with_picker
    alone = render(layout_from_args(["--replicas-dns", "replicas:50051", "--picker", "none"]))
    assert "envoy.filters.http.ext_proc" not in alone
    assert "type: STRICT_DNS" in alone


def test_a_cluster_without_replicas_is_refused() -> None:
    with pytest.raises(SystemExit, match="name the replicas"):
        layout_from_args([])


def test_the_http_listener_and_its_replicas_are_there_only_when_asked_for() -> None:
    grpc_only = render(layout_from_args(["--replica", f"{A}=8080"]))
    assert "replicas_http" not in grpc_only
    assert grpc_only == render(layout_from_args(["--replica", A]))
    both = render(layout_from_args(["--replica", f"{A}=8080", "--http-listen", "0.0.0.0:8000"]))
    assert "port_value: 8000" in both  # the listener
    assert "address: 10.0.0.1, port_value: 8080" in both  # the replica's HTTP port
    assert "value: ChatCompletions" in both
    assert "request_body_mode: BUFFERED_PARTIAL" in both
    with pytest.raises(SystemExit, match="every replica's HTTP port"):
        layout_from_args(["--replica", A, "--http-listen", "0.0.0.0:8000"])


def test_the_prefix_chain_is_keyed_by_the_model() -> None:
    """The same prompt to another model shares no block: its cache is another model's."""
    text = "a shared system prompt " * 10
    one = chained_blocks([text], model="model-a")
    other = chained_blocks([text], model="model-b")
    again = chained_blocks([text], model="model-a")
    assert {b.digest for b in one}.isdisjoint(b.digest for b in other)
    assert [b.digest for b in one] == [b.digest for b in again]


def test_ties_are_broken_by_a_seeded_draw() -> None:
    """Replicas equal in every respect are ordered by the picker's seeded generator, so a
    seed makes routing reproducible."""
    replicas = [Replica(f"127.0.0.1:{port}") for port in range(9000, 9008)]
    for replica in replicas:
        replica.up = True
    first = [rank(replicas, None, {}, ties=random.Random(7)) for _ in range(3)]
    assert first[0] == first[1] == first[2]
    orders = {tuple(rank(replicas, None, {}, ties=random.Random(seed))) for seed in range(20)}
    assert len(orders) > 1  # the seed decides
