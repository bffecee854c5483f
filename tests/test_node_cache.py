"""The Node.js client's hub cache commands (cache list, cache delete, pull --dry-run) and
a Generate that pulls first, against a real server and a loopback fake hub."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from inference.v1 import inference_pb2 as pb
from service.admission.gguf_header import read_gguf_header
from service.models.embedded import EMBEDDED_MODELS
from tests.conftest import SMOLLM, make_settings, serving
from tests.fake_hub import FakeHub, FakeRepo

NODE = shutil.which("node")
NODE_CLIENT = Path(__file__).resolve().parent.parent / "clients" / "node"
SMOLLM_FILE = EMBEDDED_MODELS[SMOLLM].locate()
SMOLLM_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SIZE = SMOLLM_FILE.stat().st_size
# A second quantization in the second repo: a choice, never read.
OTHER_NAME = "SmolLM2-135M-Instruct.Q8_0.gguf"
OTHER = b"GGUF" + b"\0" * 4092
MIB = f"{SIZE / 2**20:.1f} MiB"

pytestmark = pytest.mark.skipif(NODE is None, reason="Node.js is not installed")


def repos() -> dict[str, FakeRepo]:
    return {
        "acme/smol-gguf": FakeRepo({SMOLLM_NAME: SMOLLM_FILE, "README.md": b"# SmolLM2"}),
        "acme/two-gguf": FakeRepo({SMOLLM_NAME: SMOLLM_FILE, OTHER_NAME: OTHER}),
    }


def pull_settings(hub: FakeHub, cache: Path) -> object:
    return make_settings(
        hf_cache_dir=cache,
        hf_offline=False,
        hf_endpoint=hub.url,
        hf_token=None,
        allow_pull=True,
        pull_on_demand=True,
    )


def test_the_node_client_lists_dry_runs_pulls_and_deletes(tmp_path: Path) -> None:
    assert NODE is not None
    if not (NODE_CLIENT / "node_modules").exists():
        pytest.fail("the Node.js client's npm packages are missing: run `make install`")
    hub = FakeHub(repos=repos()).start()
    cache = tmp_path / "hub"
    try:
        with serving(pull_settings(hub, cache)) as (running, stub):  # type: ignore[arg-type]

            def node(*arguments: str) -> subprocess.CompletedProcess[str]:
                command = [NODE, str(NODE_CLIENT / "src" / "cli.mjs"), *arguments]
                return subprocess.run(
                    [*command, "--target", running.target],
                    capture_output=True,
                    text=True,
                    timeout=120,
                )

            events = list(stub.Pull(pb.PullRequest(model="acme/smol-gguf")))
            assert events[-1].finished.admit.available_locally

            listed = node("cache", "list", "--json")
            assert listed.returncode == 0, listed.stderr
            reply = json.loads(listed.stdout)
            (repo,) = [r for r in reply["repos"] if r["repo"] == "acme/smol-gguf"]
            (revision,) = repo["revisions"]
            assert revision["commit"] == hub.repos["acme/smol-gguf"].commit
            assert revision["files"] == [{"path": SMOLLM_NAME, "sizeBytes": str(SIZE)}]
            assert int(repo["sizeBytes"]) >= SIZE
            table = node("cache", "ls")
            assert table.returncode == 0, table.stderr
            assert "acme/smol-gguf" in table.stdout
            assert revision["commit"][:12] in table.stdout

            # A dry run reads the header of the file it would take, no weights.
            header = read_gguf_header(SMOLLM_FILE).data_start
            before = hub.bytes_sent("acme/two-gguf")
            dry = node("pull", "--dry-run", "acme/two-gguf:Q4_1")
            assert dry.returncode == 0, dry.stdout + dry.stderr
            assert hub.bytes_sent("acme/two-gguf") - before <= header + (1 << 20)
            assert hub.bytes_sent("acme/two-gguf", OTHER_NAME) == 0
            assert hub.repos["acme/two-gguf"].commit in dry.stdout
            assert f"{SMOLLM_NAME}  {MIB} ({SIZE} bytes)" in dry.stdout
            assert f"* {SMOLLM_NAME}" in dry.stdout  # the chosen one, among the choices
            assert f"  {OTHER_NAME}" in dry.stdout
            assert "fits on disk" in dry.stdout
            assert not (cache / "models--acme--two-gguf" / "snapshots").exists()

            # --pull-on-demand: the pull's bar on stderr, ended before the text starts.
            generated = node("generate", "--model", "acme/two-gguf:Q4_1", "--max-tokens", "2", "Hi")
            assert generated.returncode == 0, generated.stderr
            assert f"100% | {SIZE}/{SIZE} bytes" in generated.stderr
            assert f"pulled {MIB}" in generated.stderr
            finished = json.loads(generated.stdout.strip().splitlines()[-1])
            assert finished["usage"]["completionTokens"] == 2

            # Freed: what the disk holds of the repo's files (the blob and its ref), in
            # whole blocks.
            files = (cache / "models--acme--smol-gguf").rglob("*")
            on_disk = sum(
                f.lstat().st_blocks * 512 for f in files if f.is_file() and not f.is_symlink()
            )
            deleted = node("cache", "delete", "acme/smol-gguf")
            assert deleted.returncode == 0, deleted.stderr
            assert revision["commit"][:12] in deleted.stdout
            assert f"({on_disk} bytes)" in deleted.stdout
            assert not (cache / "models--acme--smol-gguf").exists()
            again = node("cache", "delete", "acme/smol-gguf")
            assert again.returncode == 2
            assert "error: NotFound:" in again.stderr  # connect's name of NOT_FOUND
    finally:
        hub.stop()
