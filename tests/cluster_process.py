"""`inference-cluster` in a child process: real replicas, the real picker and a
real Envoy on loopback, for the scale-out tests.

Starting one takes a while, so the test modules that can share one do
(`shared_cluster`): test_cluster.py's and test_cluster_http.py's."""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import grpc
from prometheus_client.parser import text_string_to_metric_families

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc

POLL_INTERVAL = 0.2


@dataclass
class ClusterProcess:
    process: subprocess.Popen[str]
    log: list[str] = field(default_factory=list)
    ready: dict[str, Any] = field(default_factory=dict)

    def read_log(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.log.append(line)
            if line.startswith('{"') and '"cluster ready"' in line:
                self.ready = json.loads(line)

    def wait_until_ready(self, timeout: float = 240) -> None:
        """The launcher gives each step of its start 120 s and exits naming the one
        that failed: this waits longer, so that its message is what a failure says."""
        deadline = time.monotonic() + timeout
        while not self.ready and time.monotonic() < deadline:
            assert self.process.poll() is None, f"the cluster exited: {self.log[-30:]}"
            time.sleep(0.05)
        assert self.ready, f"the cluster never got ready: {self.log[-30:]}"

    @property
    def listen(self) -> str:
        return str(self.ready["listen"])

    @property
    def http_listen(self) -> str:
        """Envoy's OpenAI-compatible HTTP listener."""
        return str(self.ready["http_listen"])

    @property
    def replicas(self) -> list[str]:
        return [replica["address"] for replica in self.ready["replicas"]]

    @property
    def http_addresses(self) -> dict[str, str]:
        """Each replica's gRPC address -> its HTTP address."""
        return {r["address"]: r["http_address"] for r in self.ready["replicas"]}

    def pid(self, replica: str) -> int:
        return next(int(r["pid"]) for r in self.ready["replicas"] if r["address"] == replica)

    def signal_replica(self, replica: str, signum: signal.Signals) -> None:
        os.kill(self.pid(replica), signum)

    def picker_view(self) -> str:
        """What the picker logged of the replicas (for a failing assertion's message)."""
        return "".join(line for line in self.log if '"replica ' in line)

    def wait_until_the_picker_sees_every_replica_up(self, timeout: float = 60) -> None:
        """Until the picker has polled every replica SERVING: `cluster ready` says the
        replicas and Envoy are, and a request before the picker's next poll is
        balanced by Envoy alone, so no prefix of it is remembered."""
        deadline = time.monotonic() + timeout
        while not self._picker_sees_every_replica() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert self._picker_sees_every_replica(), self.picker_view()

    def _picker_sees_every_replica(self) -> bool:
        up = [line for line in self.log if '"replica up"' in line]
        return all(any(f'"{replica}"' in line for line in up) for replica in self.replicas)

    def picker_models(self, replica: str) -> list[str]:
        """The models the picker last logged `replica` as having loaded."""
        for line in reversed(self.log):
            if '"replica ' in line and f'"{replica}"' in line:
                return list(json.loads(line).get("models", []))
        return []

    def wait_until_the_picker_sees(self, replica: str, model: str, timeout: float = 60) -> None:
        """Until the picker's view has `model` loaded on `replica`: a poll can be late on a
        busy machine, and a fixed wait then routes by an old view."""
        deadline = time.monotonic() + timeout
        while model not in self.picker_models(replica) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert model in self.picker_models(replica), self.picker_view()

    def wait_until_the_picker_sees_busy(self, replica: str, timeout: float = 60) -> None:
        """Until the picker's last poll of `replica` found a request running there (its
        metrics say so: its log does not follow load)."""
        deadline = time.monotonic() + timeout
        while self._picker_load(replica) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert self._picker_load(replica) >= 1, self.picker_view()

    def _picker_load(self, replica: str) -> float:
        return self.picker_metric("inference_picker_replica_load", replica=replica)

    def picker_metric(self, name: str, **labels: str) -> float:
        """The sum of the picker's samples of `name` that carry `labels`."""
        port = next(
            json.loads(line)["port"]
            for line in self.log
            if '"event": "metrics"' in line and '"port"' in line
        )
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            text = answer.read().decode()
        return sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == name
            and all(sample.labels.get(key) == value for key, value in labels.items())
        )

    def envoy_stats(self) -> dict[str, int]:
        """Envoy's counters and gauges, from its admin interface."""
        admin = str(self.ready["admin"])
        with urllib.request.urlopen(f"http://{admin}/stats?format=json", timeout=10) as answer:
            stats = json.load(answer)["stats"]
        return {s["name"]: int(s["value"]) for s in stats if "value" in s}

    def picker_pid(self) -> int:
        return int(self.ready["picker"]["pid"])


def cluster_command(
    replicas: int, server_args: Sequence[str] = (), launcher_args: Sequence[str] = ()
) -> list[str]:
    """inference-cluster's command line with free ports everywhere."""
    return [
        sys.executable, "-m", "service.cluster.launcher", "--replicas", str(replicas),
        "--listen", "127.0.0.1:0", "--replica-base-port", "0", "--picker-listen", "127.0.0.1:0",
        "--http-listen", "127.0.0.1:0", "--replica-http-base-port", "0",
        "--poll-interval", str(POLL_INTERVAL), "--envoy-threads", "1", "--log-format", "json",
        "--picker-metrics-listen", "127.0.0.1:0", *launcher_args,
        "--", "--threads", "1", *server_args,
    ]  # fmt: skip


@contextmanager
def cluster_process(
    replicas: int, server_args: Sequence[str] = (), launcher_args: Sequence[str] = ()
) -> Iterator[ClusterProcess]:
    """A cluster with free ports everywhere; stopped (SIGTERM, then SIGKILL) at the end.
    `launcher_args` go to inference-cluster, `server_args` to every replica."""
    command = cluster_command(replicas, server_args, launcher_args)
    env = {**os.environ, "INFERENCE_LOG_FORMAT": "json"}
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
    cluster = ClusterProcess(process)
    reader = threading.Thread(target=cluster.read_log, daemon=True)
    reader.start()
    try:
        cluster.wait_until_ready()
        cluster.wait_until_the_picker_sees_every_replica_up()
        yield cluster
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        reader.join(timeout=10)
        assert process.stderr is not None
        process.stderr.close()


_shared: dict[int, ClusterProcess] = {}
_stopping = ExitStack()
atexit.register(_stopping.close)


def shared_cluster(replicas: int = 3) -> ClusterProcess:
    """A cluster for every test module that asks for one of this size, started by
    the first and stopped when the test process exits (or started again if it died)."""
    running = _shared.get(replicas)
    if running is None or running.process.poll() is not None:
        running = _shared[replicas] = _stopping.enter_context(cluster_process(replicas))
    return running


def served_by(call: grpc.Call) -> str:
    """The replica Envoy sent the call to (its x-inference-replica header)."""
    metadata = dict(call.initial_metadata()) or dict(call.trailing_metadata())
    return str(metadata["x-inference-replica"])


def generate(
    stub: pb_grpc.InferenceStub, request: pb.GenerateRequest, timeout: float = 60
) -> tuple[str, pb.GenerationFinished, str]:
    """(text, the finished event, the replica that served it)."""
    call = stub.Generate(request, timeout=timeout)
    text = ""
    finished = pb.GenerationFinished()
    for response in call:
        if response.HasField("delta"):
            text += response.delta.text
        if response.HasField("finished"):
            finished = response.finished
    return text, finished, served_by(call)


def loaded_models(address: str) -> set[str]:
    with grpc.insecure_channel(address) as channel:
        answer = pb_grpc.InferenceStub(channel).ListModels(pb.ListModelsRequest(), timeout=10)
    return {model.name for model in answer.models if model.loaded}
