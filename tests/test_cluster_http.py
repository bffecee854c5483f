"""OpenAI-compatible HTTP through `make cluster` (issue 30): the official `openai`
SDK against Envoy's HTTP listener, with real replicas, the real picker and a real
Envoy on loopback. The picker places HTTP requests as it places gRPC ones: by the
model a replica has loaded and by the prompt prefix it was sent before, over
either protocol. Envoy names the replica that answered (its HTTP address) in
`x-inference-replica`.

The cluster is test_cluster.py's (`shared_cluster`): starting one is slow.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import grpc
import httpx2 as httpx
import openai
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from service.cluster.picker import ENDPOINT_HEADER, METHOD_METADATA
from tests.cluster_process import (
    ClusterProcess,
    generate,
    loaded_models,
    shared_cluster,
)
from tests.conftest import GEMMA, SMOLLM

# The first test of the module starts the cluster, on a busy two-core machine up to
# the launcher's own limits (120 s a step): give it room beyond pytest's 120 s.
pytestmark = pytest.mark.timeout(300)

# The picker has seen a change once it has polled every replica again.
REPLICA_HEADER = "x-inference-replica"


@pytest.fixture(scope="module")
def cluster() -> ClusterProcess:
    running = shared_cluster(replicas=3)
    wait_until_the_picker_routes_http(running)
    return running


@pytest.fixture(scope="module")
def client(cluster: ClusterProcess) -> Iterator[openai.OpenAI]:
    # No retries of its own: what Envoy and the replicas answer reaches the test.
    with openai.OpenAI(
        base_url=f"http://{cluster.http_listen}/v1", api_key="none", max_retries=0
    ) as client:
        yield client


def wait_until_the_picker_routes_http(cluster: ClusterProcess, timeout: float = 30) -> None:
    """The picker names replicas' HTTP ports for a chat body, as Envoy will ask it:
    it has polled them all (test_cluster.py may have killed it: the launcher
    starts it again, and it begins knowing nothing)."""
    wanted = set(cluster.http_addresses.values())
    message = ext.ProcessingRequest()
    message.request_body.body = json.dumps(
        {"messages": [{"role": "user", "content": "?"}]}
    ).encode()
    message.request_body.end_of_stream = True
    deadline = time.monotonic() + timeout
    named: set[str] = set()
    while time.monotonic() < deadline:
        with grpc.insecure_channel(cluster.ready["picker"]["address"]) as channel:
            stub = ext_grpc.ExternalProcessorStub(channel)
            try:
                answers = list(
                    stub.Process(
                        iter([message]), metadata=((METHOD_METADATA, "ChatCompletions"),), timeout=2
                    )
                )
            except grpc.RpcError:
                answers = []
        headers = [h for a in answers for h in a.request_body.response.header_mutation.set_headers]
        named = {
            address
            for header in headers
            if header.header.key == ENDPOINT_HEADER
            for address in header.header.raw_value.decode().split(",")
        }
        if named == wanted:
            return
        time.sleep(0.1)
    raise AssertionError(f"the picker names {named}, not every replica's HTTP port {wanted}")


def chat(client: openai.OpenAI, messages: list[Any], **fields: Any) -> tuple[str, Any, str]:
    """(the answer's text, its usage, the replica that served it: its HTTP address)."""
    raw = client.chat.completions.with_raw_response.create(
        messages=messages, **{"model": "", "max_tokens": 8, "temperature": 0, **fields}
    )
    completion = raw.parse()
    return (
        completion.choices[0].message.content or "",
        completion.usage,
        raw.headers[REPLICA_HEADER],
    )


def test_a_chat_completion_and_a_streamed_one_come_through_envoy(
    cluster: ClusterProcess, client: openai.OpenAI
) -> None:
    question: Any = [{"role": "user", "content": "What is the capital of France?"}]
    text, usage, replica = chat(client, question, model=SMOLLM, max_tokens=12)
    assert text
    assert usage.prompt_tokens > 5
    assert 0 < usage.completion_tokens <= 12
    assert replica in cluster.http_addresses.values()

    raw = client.chat.completions.with_raw_response.create(
        model=SMOLLM,
        messages=question,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    assert raw.headers["content-type"].startswith("text/event-stream")
    assert raw.headers[REPLICA_HEADER] in cluster.http_addresses.values()
    chunks = list(raw.parse())
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    # Not compared with `text`: the replica now has the prompt cached, and greedy text
    # from a cached prefix may part from a fresh one at a near-tie (docs/api.md, "What a
    # seed guarantees").
    assert streamed
    assert chunks[-1].usage is not None
    assert 0 < chunks[-1].usage.completion_tokens <= 12


def test_server_sent_events_pass_through_as_they_are_made(client: openai.OpenAI) -> None:
    """Envoy buffers nothing of a stream: its chunks arrive spread over the generation."""
    stream = client.completions.create(
        model=SMOLLM,
        prompt="1, 2, 3, 4, 5, 6, 7, 8, 9, 10,",
        max_tokens=48,
        temperature=0,
        stream=True,
    )
    arrivals = [time.monotonic() for chunk in stream if chunk.choices and chunk.choices[0].text]
    assert len(arrivals) > 20
    assert arrivals[len(arrivals) // 2] - arrivals[0] > 0.1, arrivals


def test_the_next_turn_of_a_conversation_goes_to_the_replica_that_caches_it(
    client: openai.OpenAI,
) -> None:
    messages: list[Any] = [{"role": "user", "content": "Name an animal."}]
    replicas, cached = [], []
    for turn in range(4):
        text, usage, replica = chat(client, messages)
        replicas.append(replica)
        cached.append(usage.prompt_tokens_details.cached_tokens)
        messages += [
            {"role": "assistant", "content": text},
            {"role": "user", "content": f"And {turn}?"},
        ]
    assert len(set(replicas)) == 1, replicas
    assert all(tokens > 0 for tokens in cached[1:]), cached


def test_a_conversation_begun_over_grpc_goes_on_over_http_where_it_is_cached(
    cluster: ClusterProcess, client: openai.OpenAI
) -> None:
    """The picker hashes the HTTP body's messages as it hashes the gRPC request's."""
    first = pb.ChatMessage(role="user", content="Name a river.")
    with grpc.insecure_channel(cluster.listen) as channel:
        request = pb.GenerateRequest(messages=[first], max_tokens=8, temperature=0)
        answer, _, home = generate(pb_grpc.InferenceStub(channel), request)
    messages = [
        {"role": "user", "content": first.content},
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "Another?"},
    ]
    for _ in range(2):
        _, usage, replica = chat(client, messages)
        assert replica == cluster.http_addresses[home]
        assert usage.prompt_tokens_details.cached_tokens > 0


def test_a_model_goes_to_the_replica_that_has_it_loaded(
    cluster: ClusterProcess, client: openai.OpenAI
) -> None:
    holders = [replica for replica in cluster.replicas if GEMMA in loaded_models(replica)]
    if not holders:  # test_cluster.py has not run: load it on one replica, past Envoy
        holders = [cluster.replicas[2]]  # where test_cluster.py would
        direct = f"http://{cluster.http_addresses[holders[0]]}/v1"
        with openai.OpenAI(base_url=direct, api_key="none", max_retries=0) as alone:
            alone.completions.create(model=GEMMA, prompt="Hello", max_tokens=2)
    (home,) = holders
    cluster.wait_until_the_picker_sees(home, GEMMA)
    for prompt in ("Once upon a time", "The capital of France is", "Water boils at"):
        raw = client.completions.with_raw_response.create(
            model=GEMMA, prompt=prompt, max_tokens=4, temperature=0
        )
        assert raw.parse().choices[0].text is not None
        assert raw.headers[REPLICA_HEADER] == cluster.http_addresses[home], cluster.picker_view()
    assert [GEMMA in loaded_models(r) for r in cluster.replicas].count(True) == 1


def test_http2_clients_are_served_too(cluster: ClusterProcess) -> None:
    """HTTP/2 without TLS (prior knowledge) downstream; the replicas get HTTP/1.1."""
    with (
        httpx.Client(http1=False, http2=True) as http2,
        openai.OpenAI(
            base_url=f"http://{cluster.http_listen}/v1",
            api_key="none",
            max_retries=0,
            http_client=http2,
        ) as client,
    ):
        raw = client.chat.completions.with_raw_response.create(
            model=SMOLLM, messages=[{"role": "user", "content": "Hi"}], max_tokens=4
        )
        assert raw.http_response.http_version == "HTTP/2"
        assert raw.parse().choices[0].message.content is not None
        models = client.models.list()
    assert {model.id for model in models} >= {SMOLLM, GEMMA}


def test_a_body_that_is_not_json_reaches_a_replica_and_is_refused_there(
    cluster: ClusterProcess,
) -> None:
    request = urllib.request.Request(
        f"http://{cluster.http_listen}/v1/chat/completions",
        data=b"messages=Hi",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 400
    assert refused.value.headers[REPLICA_HEADER] in cluster.http_addresses.values()
    with refused.value as answer:
        assert "not JSON" in json.loads(answer.read())["error"]["message"]


def test_health_through_envoy_answers_from_a_replica(cluster: ClusterProcess) -> None:
    with urllib.request.urlopen(f"http://{cluster.http_listen}/health", timeout=30) as answer:
        assert json.loads(answer.read()) == {"status": "ok"}
        assert answer.headers[REPLICA_HEADER] in cluster.http_addresses.values()
