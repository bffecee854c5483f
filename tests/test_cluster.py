"""Many replicas behind a real Envoy and the endpoint picker, all on loopback
(`inference-cluster`, as `make cluster` runs it): cache and model affinity,
overload, drain, failover, and serving on without the picker."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from tests.cluster_process import (
    ClusterProcess,
    cluster_process,
    generate,
    loaded_models,
    served_by,
    shared_cluster,
)
from tests.conftest import GEMMA

# The first test of the module starts the cluster, on a busy two-core machine up to
# the launcher's own limits (120 s a step): give it room beyond pytest's 120 s.
pytestmark = pytest.mark.timeout(300)

NODE = shutil.which("node")
NODE_CLIENT = Path(__file__).resolve().parent.parent / "clients" / "node"
# The picker has seen a change once it has polled every replica again.
# A raw prompt the instruct model keeps continuing: a stream that runs for seconds.
COUNTING = pb.GenerateRequest(
    prompt="1, 2, 3, 4, 5, 6, 7, 8, 9, 10,", max_tokens=300, temperature=0
)


@pytest.fixture(scope="module")
def cluster() -> ClusterProcess:
    return shared_cluster(replicas=3)  # test_cluster_http.py's too


@pytest.fixture(scope="module")
def through_envoy(cluster: ClusterProcess) -> Iterator[pb_grpc.InferenceStub]:
    with grpc.insecure_channel(cluster.listen) as channel:
        yield pb_grpc.InferenceStub(channel)


class Stream:
    """A long generation on its own thread; `started` once its first token is in."""

    def __init__(self, address: str, request: pb.GenerateRequest = COUNTING) -> None:
        self.started = threading.Event()
        self.finished: pb.GenerationFinished | None = None
        self.error: grpc.RpcError | None = None
        self.replica = ""
        self._channel = grpc.insecure_channel(address)
        self._request = request
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self.started.wait(60), f"no first token: {self.error}"

    def _run(self) -> None:
        call = pb_grpc.InferenceStub(self._channel).Generate(self._request, timeout=120)
        try:
            for response in call:
                if response.HasField("delta") and not self.started.is_set():
                    self.replica = served_by(call) if _via_envoy(call) else ""
                    self.started.set()
                if response.HasField("finished"):
                    self.finished = response.finished
        except grpc.RpcError as exc:
            self.error = exc
        finally:
            self.started.set()

    def join(self, timeout: float = 120) -> None:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the stream hangs"
        self._channel.close()


def _via_envoy(call: grpc.Call) -> bool:
    return "x-inference-replica" in dict(call.initial_metadata())


def _user(text: str) -> pb.ChatMessage:
    return pb.ChatMessage(role="user", content=text)


def test_a_conversation_stays_on_the_replica_that_caches_it(
    cluster: ClusterProcess, through_envoy: pb_grpc.InferenceStub
) -> None:
    messages = [_user("Name a colour.")]
    replicas, cached = [], []
    for turn in range(6):
        request = pb.GenerateRequest(messages=messages, max_tokens=8, temperature=0)
        text, finished, replica = generate(through_envoy, request)
        replicas.append(replica)
        cached.append(finished.usage.cached_prompt_tokens)
        messages += [pb.ChatMessage(role="assistant", content=text), _user(f"And {turn}?")]
    assert len(set(replicas)) == 1, (replicas, cluster.picker_view())
    assert all(tokens > 0 for tokens in cached[1:]), cached


def test_a_model_goes_where_it_is_loaded_and_a_cold_one_to_the_least_busy(
    cluster: ClusterProcess, through_envoy: pb_grpc.InferenceStub
) -> None:
    first, second, idle = cluster.replicas
    # The shared cluster: test_cluster_http.py loads it on `idle` only, if at all.
    assert all(GEMMA not in loaded_models(r) for r in (first, second))
    busy = [Stream(first), Stream(second)]  # straight to the replicas, past Envoy
    for replica in (first, second):
        cluster.wait_until_the_picker_sees_busy(replica)
    request = pb.GenerateRequest(model=GEMMA, prompt="The sky is", max_tokens=4, temperature=0)
    served = generate(through_envoy, request)[2]
    assert served == idle, cluster.picker_view()  # cold everywhere: the least busy
    for stream in busy:
        stream.join()
    cluster.wait_until_the_picker_sees(idle, GEMMA)
    for text in ("Once upon a time", "The capital of France is", "Water boils at"):
        request = pb.GenerateRequest(model=GEMMA, prompt=text, max_tokens=4, temperature=0)
        served = generate(through_envoy, request)[2]
        assert served == idle, cluster.picker_view()  # loaded there only: no second load
    assert [GEMMA in loaded_models(r) for r in cluster.replicas] == [False, False, True]


def test_every_client_works_through_envoy_unchanged(cluster: ClusterProcess) -> None:
    """The Python and Node.js command-line clients, and server reflection (what
    grpcurl uses), all through Envoy."""
    python_cli = [sys.executable, "-m", "clients.cli", "--target", cluster.listen]
    done = subprocess.run(
        [*python_cli, "generate", "--max-tokens", "4", "--temperature", "0", "Hi"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()
    if NODE is not None and (NODE_CLIENT / "node_modules").exists():
        node = [NODE, str(NODE_CLIENT / "src" / "cli.mjs"), "--target", cluster.listen]
        done = subprocess.run(
            [*node, "generate", "--max-tokens", "4", "Hi"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
    with grpc.insecure_channel(cluster.listen) as channel:
        services = ProtoReflectionDescriptorDatabase(channel).get_services()
    assert "inference.v1.Inference" in services


def test_a_replica_at_its_limit_is_passed_over() -> None:
    limits = ["--max-concurrent", "1", "--max-queue", "0"]
    with cluster_process(2, limits) as cluster, grpc.insecure_channel(cluster.listen) as channel:
        stub = pb_grpc.InferenceStub(channel)
        messages = [_user("Name a fruit.")]
        text, _, home = generate(stub, pb.GenerateRequest(messages=messages, max_tokens=8))
        busy = Stream(home)  # fills the replica that caches the conversation
        messages += [pb.ChatMessage(role="assistant", content=text), _user("Another?")]
        for _ in range(3):
            request = pb.GenerateRequest(messages=messages, max_tokens=4)
            assert generate(stub, request)[2] != home
        busy.join()
        assert busy.error is None
        assert busy.finished is not None


def test_a_draining_replica_finishes_its_streams_and_gets_no_new_ones() -> None:
    with cluster_process(2, ["--grace-period", "60"]) as cluster:
        running = Stream(cluster.listen)
        draining = running.replica
        (other,) = set(cluster.replicas) - {draining}
        cluster.signal_replica(draining, signal.SIGTERM)
        with grpc.insecure_channel(cluster.listen) as channel:
            stub = pb_grpc.InferenceStub(channel)
            for n in range(5):
                request = pb.GenerateRequest(prompt=f"Say {n}", max_tokens=2, temperature=0)
                assert generate(stub, request)[2] == other
        running.join()
        assert running.error is None
        assert running.finished is not None
        assert running.finished.finish_reason == pb.FINISH_REASON_LENGTH


def test_a_crashed_engine_is_unavailable_and_a_killed_replica_a_reset() -> None:
    """What a mesh can retry: an engine that dies under a live front (a native crash,
    the OOM killer) ends its streams with UNAVAILABLE trailers, which Envoy passes on;
    a replica killed whole can only be reset by Envoy, and the rest serve on."""
    with cluster_process(2) as cluster:
        crashed = Stream(cluster.listen)
        with grpc.insecure_channel(crashed.replica) as direct:
            models = pb_grpc.InferenceStub(direct).ListModels(pb.ListModelsRequest()).models
        (engine_pid,) = [m.engine_pid for m in models if m.loaded]
        os.kill(engine_pid, signal.SIGKILL)
        crashed.join(timeout=30)
        assert crashed.error is not None
        assert crashed.error.code() == grpc.StatusCode.UNAVAILABLE
        assert "SIGKILL" in (crashed.error.details() or "")

        doomed = Stream(cluster.listen)
        (survivor,) = set(cluster.replicas) - {doomed.replica}
        cluster.signal_replica(doomed.replica, signal.SIGKILL)
        doomed.join(timeout=30)  # ends at once, rather than hanging
        assert doomed.error is not None
        # Envoy resets a stream whose replica died after it answered (RST_STREAM
        # INTERNAL_ERROR, which gRPC clients read as INTERNAL): once response headers
        # have gone out its router can only reset, and no filter sees the reset in
        # time to send trailers instead (docs/cluster.md, "What a client sees"). A
        # replica that dies before answering is retried on another, or UNAVAILABLE.
        assert doomed.error.code() == grpc.StatusCode.INTERNAL
        assert "RST_STREAM" in (doomed.error.details() or "")
        with grpc.insecure_channel(cluster.listen) as channel:
            stub = pb_grpc.InferenceStub(channel)
            request = pb.GenerateRequest(prompt="Hello", max_tokens=2, temperature=0)
            for _ in range(5):
                assert generate(stub, request)[2] == survivor


def test_serving_goes_on_while_the_picker_hangs_or_dies(cluster: ClusterProcess) -> None:
    """Envoy waits at most 200 ms for the picker, then balances on its own; a dead
    picker is started again by the launcher."""
    request = pb.GenerateRequest(prompt="Hello", max_tokens=2, temperature=0)
    with grpc.insecure_channel(cluster.listen) as channel:
        stub = pb_grpc.InferenceStub(channel)
        os.kill(cluster.picker_pid(), signal.SIGSTOP)
        try:
            served = {generate(stub, request)[2] for _ in range(6)}
        finally:
            os.kill(cluster.picker_pid(), signal.SIGCONT)
        assert served <= set(cluster.replicas)
        os.kill(cluster.picker_pid(), signal.SIGKILL)
        for _ in range(6):
            assert generate(stub, request)[2] in cluster.replicas
