"""The Go client, built from the committed generated code, against a real server.

clients/go/build-offline.sh builds it from Debian's Go packages, as clients/go/README.md
tells a user without a module proxy to; Go is optional, so without it (or those
packages) the tests are skipped with the reason.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import RunningServer

CLIENT = Path(__file__).resolve().parent.parent / "clients" / "go"
GO_SOURCES = Path("/usr/share/gocode/src/google.golang.org/grpc")

pytestmark = [
    pytest.mark.skipif(shutil.which("go") is None, reason="Go is not installed"),
    pytest.mark.skipif(
        not GO_SOURCES.exists(),
        reason="Debian's Go gRPC packages are not installed (clients/go/README.md)",
    ),
]


@pytest.fixture(scope="module")
def inference_go(tmp_path_factory: pytest.TempPathFactory) -> Path:
    binary = tmp_path_factory.mktemp("go") / "inference-go"
    done = subprocess.run(
        [str(CLIENT / "build-offline.sh"), str(binary)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return binary


def run_cli(
    binary: Path, server: RunningServer, *arguments: str
) -> subprocess.CompletedProcess[str]:
    command = [str(binary), "-target", server.target, "-timeout", "60s", *arguments]
    return subprocess.run(command, capture_output=True, text=True, timeout=90)


def test_go_lists_models(inference_go: Path, server: RunningServer) -> None:
    done = run_cli(inference_go, server, "models")
    assert done.returncode == 0, done.stderr
    reply = json.loads(done.stdout)
    assert reply["defaultModel"] == "smollm2-135m-instruct"
    assert reply["defaultModel"] in {model["name"] for model in reply["models"]}


def test_go_admits_the_default_model(inference_go: Path, server: RunningServer) -> None:
    done = run_cli(inference_go, server, "admit", "smollm2-135m-instruct")
    assert done.returncode == 0, done.stderr
    reply = json.loads(done.stdout)
    assert reply["admitted"] is True
    assert reply["backend"] == "llama.cpp"


def test_go_streams_a_chat_completion(inference_go: Path, server: RunningServer) -> None:
    done = run_cli(
        inference_go,
        server,
        "-chat",
        "-temperature",
        "0",
        "-max-tokens",
        "48",
        "generate",
        "What is 2+2?",
    )
    assert done.returncode == 0, done.stderr
    assert "4" in done.stdout
    summary = json.loads(done.stderr.strip().splitlines()[-1])
    assert summary["clientTtftMs"] > 0
    finished = summary["finished"]
    assert finished["finishReason"] == "FINISH_REASON_END_OF_TURN"
    assert finished["usage"]["completionTokens"] > 0
    assert finished["usage"]["promptTokens"] > 0


def test_go_sees_grpc_status_codes(inference_go: Path, server: RunningServer) -> None:
    done = run_cli(inference_go, server, "-model", "no-such-model", "generate", "hi")
    assert done.returncode == 2
    assert "NotFound" in done.stderr


def test_go_checks_health(inference_go: Path, server: RunningServer) -> None:
    done = run_cli(inference_go, server, "health")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "SERVING"
