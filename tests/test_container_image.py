"""The container image (issue 31): built from a fresh clone, run, drained.

The image is what deploy/kubernetes runs, so this test builds it as `make image`
does (scripts/image/build.sh) from a clone of the committed tree, on a base made
with debootstrap from Debian's packages (no image registry is reachable from
these machines), and then:
- runs it with the server on loopback, waits for health SERVING, streams one
  Generate through it with the Python client, and stops it with SIGTERM: the
  drain ends with exit status 0;
- runs its `inference-picker --help` and `envoy --version`;
- builds it again: with nothing changed, every step comes from the cache.

It installs nothing: podman and the base image are `make container-prerequisites`'
(tests/container.py). Without them it is skipped with the reason, or fails in CI.
"""

from __future__ import annotations

import os
import resource
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.container import base_image, container_engine

ROOT = Path(__file__).resolve().parent.parent
TAG = "localhost/inference-service:test"

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
    assert f"{TAG}: " in output
    assert " MiB" in output
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


def test_the_image_serves_a_generate_and_drains_on_sigterm(image: str, engine: str) -> None:
    grpc_port, health_port = free_port(), free_port()
    address = f"127.0.0.1:{grpc_port}"
    name = f"inference-test-{grpc_port}"
    run(engine, "run", "--detach", "--name", name, "--network", "host", *limits(engine), image,
        f"--listen={address}", f"--health-listen=127.0.0.1:{health_port}")  # fmt: skip
    try:
        deadline = time.monotonic() + 300  # a guard against a hang, not a speed check
        while not serving(address):
            state = run(engine, "inspect", "--format", "{{.State.Status}}", name).strip()
            assert state == "running", run(engine, "logs", name)
            assert time.monotonic() < deadline, run(engine, "logs", name)
            time.sleep(1)
        client = [sys.executable, "-m", "clients.cli", "--target", address]
        answer = run(*client, "generate", "--max-tokens", "6", "The capital of France is")
        assert "completion tokens" in answer  # the usage line after the streamed text
        run(engine, "stop", "--time", "60", name)  # SIGTERM, then the drain
        status = run(engine, "inspect", "--format", "{{.State.ExitCode}}", name).strip()
        logs = run(engine, "logs", name)
        assert status == "0", logs
        assert '"event": "draining"' in logs
    finally:
        subprocess.run([engine, "rm", "-f", name], capture_output=True, check=False)


def test_the_image_holds_the_picker_and_envoy(image: str, engine: str) -> None:
    picker = run(engine, "run", "--rm", *limits(engine), "--entrypoint", "inference-picker",
                 image, "--help")  # fmt: skip
    assert "usage: inference-picker" in picker
    envoy = run(engine, "run", "--rm", *limits(engine), "--entrypoint", "envoy", image,
                "--version")  # fmt: skip
    assert "/1.40." in envoy
    user = run(engine, "run", "--rm", *limits(engine), "--entrypoint", "id", image, "-u")
    assert user.strip() == "10001"  # as the manifests' runAsUser


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
