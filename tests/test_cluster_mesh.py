"""What a mesh, a browser and a JSON client see through the cluster's Envoy (issue 46):
a client's deadline comes back as the replica's DEADLINE_EXCEEDED, never an Envoy
reset; grpc-web (a real Node.js grpc-web client, and by hand over HTTP/1.1 and
HTTP/2) and CORS on the gRPC port, gRPC itself unchanged there; the contract as JSON
(gRPC-JSON transcoding) on the HTTP port, placed by the picker.

One cluster of one replica for the module, its own: it is started with CORS origins.
A replica killed mid-stream is test_cluster.py's (its own cluster of two).
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from tests import raw_grpc
from tests.cluster_process import ClusterProcess, cluster_process
from tests.conftest import SMOLLM

# The first test of the module starts the cluster, on a busy two-core machine up to
# the launcher's own limits (120 s a step): give it room beyond pytest's 120 s.
pytestmark = pytest.mark.timeout(300)

ORIGIN = "https://app.example"
NODE = shutil.which("node")
NODE_CLIENT = Path(__file__).resolve().parent.parent / "clients" / "node"
# A raw prompt the instruct model keeps continuing: a stream that would run for many
# seconds, far past every deadline below, however fast the machine.
COUNTING = pb.GenerateRequest(
    prompt="1, 2, 3, 4, 5, 6, 7, 8, 9, 10,", max_tokens=2000, temperature=0
)
GENERATE = "/inference.v1.Inference/Generate"
LIST_MODELS = "/inference.v1.Inference/ListModels"
GRPC_WEB = "application/grpc-web+proto"
# grpc-web's frame flag for the trailers, which it sends in the body.
TRAILERS_FRAME = 0x80


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterProcess]:
    with cluster_process(1, launcher_args=["--cors-origins", ORIGIN]) as running:
        yield running


def _deadlines(count: int) -> list[float]:
    """Seconds from 0.2 to 0.8: all well inside a COUNTING stream."""
    return [0.2 + 0.6 * i / (count - 1) for i in range(count)]


def test_a_deadline_comes_back_as_the_replica_s_deadline_exceeded(
    cluster: ClusterProcess,
) -> None:
    """Envoy used to enforce grpc-timeout itself and reset started streams
    (RST_STREAM INTERNAL_ERROR: INTERNAL for the client) in about a quarter of
    these. A raw HTTP/2 client, which enforces no deadline of its own, sees what
    Envoy sends: the replica's trailers. A gRPC library's calls all end
    DEADLINE_EXCEEDED."""
    endings = [
        raw_grpc.call(cluster.listen, GENERATE, COUNTING, timeout_ms=round(seconds * 1000))
        for seconds in _deadlines(20)
    ]
    assert [(e.grpc_status, e.reset_code) for e in endings] == [("4", None)] * 20
    codes = []
    with grpc.insecure_channel(cluster.listen) as channel:
        stub = pb_grpc.InferenceStub(channel)
        for seconds in _deadlines(20):
            with pytest.raises(grpc.RpcError) as failure:
                for _ in stub.Generate(COUNTING, timeout=seconds):
                    pass
            codes.append(failure.value.code())
    assert codes == [grpc.StatusCode.DEADLINE_EXCEEDED] * 20
    limits = {n: v for n, v in cluster.envoy_stats().items() if "max_duration_reached" in n}
    assert limits, "Envoy's stats name no max_duration_reached"
    assert set(limits.values()) == {0}, limits


@pytest.mark.skipif(NODE is None, reason="Node.js is not installed")
def test_a_node_grpc_web_client_lists_models_and_streams_a_generation(
    cluster: ClusterProcess,
) -> None:
    if not (NODE_CLIENT / "node_modules" / "@connectrpc" / "connect-web").exists():
        pytest.skip("the Node.js client's packages are not installed (npm ci in clients/node)")
    assert NODE is not None
    script = NODE_CLIENT / "src" / "grpc-web.mjs"
    done = subprocess.run(
        [NODE, str(script), "--target", cluster.listen, "--max-tokens", "6", "Once upon a time"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert SMOLLM in lines[0]["models"]
    text = "".join(line["delta"] for line in lines if "delta" in line)
    assert text.strip()
    assert lines[-1]["finished"]["finishReason"] == "FINISH_REASON_LENGTH"
    assert lines[-1]["finished"]["usage"]["completionTokens"] == 6


def _grpc_web_body(message: pb.ListModelsRequest) -> bytes:
    payload = message.SerializeToString()
    return struct.pack(">BI", 0, len(payload)) + payload


def _frames(body: bytes) -> list[tuple[int, bytes]]:
    frames, position = [], 0
    while position < len(body):
        flag, length = struct.unpack(">BI", body[position : position + 5])
        frames.append((flag, body[position + 5 : position + 5 + length]))
        position += 5 + length
    return frames


def _trailers(body: bytes) -> dict[str, str]:
    (flag, block) = _frames(body)[-1]
    assert flag == TRAILERS_FRAME
    pairs = (line.split(":", 1) for line in block.decode().split("\r\n") if line)
    return {name.strip().lower(): value.strip() for name, value in pairs}


def test_grpc_web_over_http1_and_http2_with_the_headers_a_page_may_read(
    cluster: ClusterProcess,
) -> None:
    """A browser's grpc-web call, by hand: HTTP/1.1 (what a page speaks without TLS)
    used to have its connection closed, HTTP/2 a 503."""
    request = urllib.request.Request(
        f"http://{cluster.listen}{LIST_MODELS}",
        data=_grpc_web_body(pb.ListModelsRequest()),
        headers={"Content-Type": GRPC_WEB, "X-Grpc-Web": "1", "Origin": ORIGIN},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        headers, body = answer.headers, answer.read()
    assert headers["Content-Type"].startswith("application/grpc-web")
    assert headers["Access-Control-Allow-Origin"] == ORIGIN
    exposed = {name.strip() for name in headers["Access-Control-Expose-Headers"].split(",")}
    assert {"grpc-status", "grpc-message", "x-inference-replica"} <= exposed
    assert headers["x-inference-replica"] in cluster.replicas
    assert _trailers(body)["grpc-status"] == "0"
    flag, message = _frames(body)[0]
    assert flag == 0
    assert SMOLLM in {model.name for model in pb.ListModelsResponse.FromString(message).models}

    over_h2 = raw_grpc.call(
        cluster.listen, LIST_MODELS, pb.ListModelsRequest(), content_type=GRPC_WEB
    )
    assert over_h2.headers[":status"] == "200"
    assert over_h2.reset_code is None
    assert _trailers(over_h2.data)["grpc-status"] == "0"


def _preflight(address: str, path: str, origin: str) -> dict[str, str]:
    request = urllib.request.Request(
        f"http://{address}{path}",
        headers={
            "Origin": origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type,x-grpc-web,authorization",
        },
        method="OPTIONS",
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 200
        return {name.lower(): value for name, value in answer.headers.items()}


def test_envoy_answers_preflights_and_allows_only_the_configured_origin(
    cluster: ClusterProcess,
) -> None:
    for address, path in ((cluster.listen, GENERATE), (cluster.http_listen, "/v1/completions")):
        allowed = _preflight(address, path, ORIGIN)
        assert allowed["access-control-allow-origin"] == ORIGIN
        asked = {h.strip() for h in allowed["access-control-allow-headers"].split(",")}
        assert {"content-type", "x-grpc-web", "authorization"} <= asked
        assert "POST" in allowed["access-control-allow-methods"]
        refused = _preflight(address, path, "https://elsewhere.example")
        assert "access-control-allow-origin" not in refused
        assert "x-inference-replica" not in refused  # answered by Envoy, not a replica


def _post_json(address: str, path: str, body: dict[str, object]) -> urllib.request.Request:
    return urllib.request.Request(
        f"http://{address}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )


def test_the_contract_is_served_as_json_and_the_picker_places_it(
    cluster: ClusterProcess,
) -> None:
    """gRPC-JSON transcoding on the HTTP port: a unary call is one JSON object, a
    server stream one JSON object a line; an error is its HTTP status with the
    gRPC status as JSON. The picker reads a transcoded Generate's body as it reads
    a gRPC one."""
    with urllib.request.urlopen(f"http://{cluster.http_listen}/inference/v1/models") as answer:
        models = json.load(answer)["models"]
    assert SMOLLM in {model["name"] for model in models}

    unread = cluster.picker_metric("inference_picker_unread_bodies_total", method="Generate")
    prompted = cluster.picker_metric("inference_picker_prompt_chars_total")
    prompt = "Count slowly, one number a line, and say nothing else at all: " * 2
    body = {"prompt": prompt, "maxTokens": 5, "temperature": 0}
    with urllib.request.urlopen(
        _post_json(cluster.http_listen, "/inference/v1/generate", body), timeout=60
    ) as answer:
        assert answer.headers["Content-Type"].startswith("application/json")
        assert answer.headers["x-inference-replica"] in cluster.replicas
        events = [json.loads(line) for line in answer.read().decode().splitlines() if line]
    assert list(events[0]) == ["started"]
    assert all(list(event) == ["delta"] for event in events[1:-1])
    assert events[-1]["finished"]["finishReason"] == "FINISH_REASON_LENGTH"
    assert events[-1]["finished"]["usage"]["completionTokens"] == 5
    assert cluster.picker_metric("inference_picker_prompt_chars_total") - prompted >= 64
    after = cluster.picker_metric("inference_picker_unread_bodies_total", method="Generate")
    assert after == unread

    missing = _post_json(
        cluster.http_listen, "/inference/v1/generate", {"model": "nope", "prompt": "Hi"}
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(missing, timeout=30)
    assert refused.value.code == 404
    assert json.load(refused.value)["code"] == grpc.StatusCode.NOT_FOUND.value[0]
