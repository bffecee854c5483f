"""When the server's storage is not what it expects (issue 42): each case names the path,
why, and what to do, and nothing fails as INTERNAL or as a silent wait.

- The temporary directory: serving text and embeddings needs none (a read-only root
  with no writable /tmp serves); a TMPDIR that cannot be used stops the server at
  start, saying so; the external image command, which needs a folder, says why not.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from service import scratch
from service.admission.gates import llama_cpp_knows_architecture
from service.backends.llama_cpp.log import captured_parser_output
from service.errors import NotSupported
from service.images import external
from tests.conftest import finished_of
from tests.server_process import server_process, wait_until_serving

# --- the temporary directory ------------------------------------------------------------


@pytest.fixture
def no_temporary_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """tempfile's directory is one that does not exist: whatever writes there fails."""
    missing = str(tmp_path / "missing")
    monkeypatch.setattr(tempfile, "tempdir", missing)
    return missing


def test_admission_probes_an_architecture_without_a_temporary_directory(
    no_temporary_directory: str,
) -> None:
    # Not the cached answer: the probe itself runs, in memory.
    assert llama_cpp_knows_architecture.__wrapped__("llama")
    assert not llama_cpp_knows_architecture.__wrapped__("no-such-architecture")


def test_the_grammar_parsers_output_is_captured_without_a_temporary_directory(
    no_temporary_directory: str,
) -> None:
    with captured_parser_output() as printed:
        os.write(2, b"error parsing grammar: at line 1\n")
    assert printed == ["error parsing grammar: at line 1\n"]


def test_the_image_commands_folder_says_why_there_is_none(no_temporary_directory: str) -> None:
    with pytest.raises(NotSupported) as refused, external._working_folder():
        pass
    assert "the external image command needs a working folder" in refused.value.message


def test_a_named_temporary_directory_that_cannot_be_used_is_named_with_the_fix(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    monkeypatch.setenv("TMPDIR", str(a_file / "tmp"))
    problem = scratch.named_temporary_directory_problem()
    assert problem is not None
    assert f"TMPDIR={a_file / 'tmp'}" in problem
    assert "not a directory" in problem
    assert "set TMPDIR to a writable directory, or mount a writable volume at /tmp" in problem
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    assert scratch.named_temporary_directory_problem() is None


def test_a_server_whose_tmpdir_cannot_be_used_exits_at_once_saying_so(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    with server_process(env={"TMPDIR": str(missing)}) as server:
        assert server.process.wait(timeout=60) != 0
    said = "".join(server.log)
    assert f"cannot start: the temporary directory TMPDIR={missing} cannot be used" in said
    assert "no such file or directory" in said
    assert "mount a writable volume at /tmp" in said


def _mounts_read_only_tmpfs() -> str | None:
    """Why this machine cannot give a child process a read-only /tmp; None if it can."""
    if shutil.which("unshare") is None:
        return "no unshare(1)"
    mount = ["mount", "-t", "tmpfs", "-o", "ro", "tmpfs", "/tmp"]
    probe = subprocess.run(
        ["unshare", "-m", "--propagation", "private", *mount], capture_output=True
    )
    if probe.returncode != 0:
        return f"a mount namespace with a read-only tmpfs is not allowed here: {probe.stderr!r}"
    return None


@pytest.fixture
def without_tmp() -> Iterator[subprocess.Popen[str]]:
    """`inference-server` in a mount namespace of its own where /tmp and /var/tmp are
    read-only, as in a container with a read-only root and no volume at /tmp."""
    why = _mounts_read_only_tmpfs()
    if why is not None:
        pytest.skip(why)
    script = (
        "mount -t tmpfs -o ro tmpfs /tmp && mount -t tmpfs -o ro tmpfs /var/tmp && cd /tmp && "
        'exec "$@"'
    )
    command = [sys.executable, "-m", "service.front", "--listen", "127.0.0.1:0"]
    env = {k: v for k, v in os.environ.items() if k not in ("TMPDIR", "TEMP", "TMP")}
    env.update(INFERENCE_LOG_FORMAT="json", PYTHONPATH=os.getcwd())
    process = subprocess.Popen(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", *command],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        yield process
    finally:
        process.kill()
        process.wait(timeout=10)
        assert process.stderr is not None
        process.stderr.close()


@pytest.mark.slow  # a server in a mount namespace of its own
def test_a_server_without_a_writable_tmp_serves_text(
    without_tmp: subprocess.Popen[str],
) -> None:
    assert without_tmp.stderr is not None
    lines: list[str] = []
    deadline = time.monotonic() + 60
    while not any('"serving"' in line for line in lines) and time.monotonic() < deadline:
        line = without_tmp.stderr.readline()
        assert line, f"the server exited: {lines}"
        lines.append(line)
    said = "".join(lines)
    assert "serving text and embeddings without a temporary directory" in said
    assert "/tmp: read-only file system" in said
    address = next(line for line in lines if '"serving"' in line).split('"address": "')[1]
    address = address.split('"')[0]
    with grpc.insecure_channel(address) as channel:
        wait_until_serving(channel)  # the default model was admitted and loaded
        stub = pb_grpc.InferenceStub(channel)
        # A grammar: the parser's output is captured in memory.
        request = pb.GenerateRequest(prompt="Yes or no?", max_tokens=2, grammar='root ::= "yes"')
        assert finished_of(list(stub.Generate(request)))
