"""A client in another language, generated from the same contract, against a real server."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import RunningServer

CLIENT = Path(__file__).resolve().parent.parent / "clients" / "typescript"
NODE = shutil.which("node")

pytestmark = pytest.mark.skipif(
    NODE is None or not (CLIENT / "node_modules").exists(),
    reason="Node.js or the TypeScript client's npm packages are missing (make install)",
)


def run_client(server: RunningServer, *arguments: str) -> subprocess.CompletedProcess[str]:
    assert NODE is not None
    command = [NODE, str(CLIENT / "src" / "generate.mjs"), "--target", server.target, *arguments]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def test_node_streams_a_chat_completion(server: RunningServer) -> None:
    done = run_client(server, "--chat", "--temperature", "0", "--max-tokens", "48", "What is 2+2?")
    assert done.returncode == 0, done.stderr
    *text, summary = done.stdout.strip().splitlines()
    assert "4" in "\n".join(text)
    finished = json.loads(summary)
    assert finished["finishReason"] == "FINISH_REASON_END_OF_TURN"
    assert finished["usage"]["completionTokens"] > 0


def test_node_sees_grpc_status_codes(server: RunningServer) -> None:
    done = run_client(server, "--model", "no-such-model", "hi")
    assert done.returncode == 2
    assert "NotFound" in done.stderr
