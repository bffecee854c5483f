"""The Node.js client, generated from the same contract, against a real server."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import RunningServer

CLIENT = Path(__file__).resolve().parent.parent / "clients" / "node"
NODE = shutil.which("node")

pytestmark = pytest.mark.skipif(NODE is None, reason="Node.js is not installed")


def run_cli(server: RunningServer, *arguments: str) -> subprocess.CompletedProcess[str]:
    assert NODE is not None
    if not (CLIENT / "node_modules").exists():
        pytest.fail("the Node.js client's npm packages are missing: run `make install`")
    command = [NODE, str(CLIENT / "src" / "cli.mjs"), *arguments, "--target", server.target]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def test_node_streams_a_chat_completion(server: RunningServer) -> None:
    done = run_cli(
        server, "generate", "--chat", "--temperature", "0", "--max-tokens", "48", "What is 2+2?"
    )
    assert done.returncode == 0, done.stderr
    *text, summary = done.stdout.strip().splitlines()
    assert "4" in "\n".join(text)
    finished = json.loads(summary)
    assert finished["finishReason"] == "FINISH_REASON_END_OF_TURN"
    assert finished["usage"]["completionTokens"] > 0


def test_node_sends_a_request_id_and_sees_it_back(server: RunningServer) -> None:
    done = run_cli(
        server, "generate", "--prompt", "Hi", "--max-tokens", "2", "--request-id", "node-42"
    )
    assert done.returncode == 0, done.stderr
    assert "x-request-id: node-42" in done.stderr


def test_node_lists_models(server: RunningServer) -> None:
    done = run_cli(server, "models")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["defaultModel"] == "smollm2-135m-instruct"


def test_node_sees_grpc_status_codes(server: RunningServer) -> None:
    done = run_cli(server, "generate", "--model", "no-such-model", "hi")
    assert done.returncode == 2
    assert "NotFound" in done.stderr


def test_node_embeds_texts(server: RunningServer) -> None:
    done = run_cli(server, "embed", "A man is eating food.", "A man is eating bread.")
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.strip().splitlines()]
    assert [line["text"] for line in lines] == ["A man is eating food.", "A man is eating bread."]
    first, second = (line["embedding"] for line in lines)
    assert len(first) == len(second) == 384
    assert sum(a * b for a, b in zip(first, second, strict=True)) > 0.6  # unit vectors, close
    assert "2 vectors of 384 (mean pooling)" in done.stderr
