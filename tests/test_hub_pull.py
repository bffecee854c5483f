"""Pull: a hub model into the hub cache, with progress, then served from there.

A real server downloads from tests/fake_hub.py (loopback, real files, every
body byte counted), through huggingface_hub's own download code.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from filelock import FileLock

from clients.cli import main
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from service.models.embedded import EMBEDDED_MODELS
from tests.conftest import SMOLLM, collect, finished_of, make_settings, serving
from tests.fake_hub import FakeHub, FakeRepo

SMOLLM_FILE = EMBEDDED_MODELS[SMOLLM].locate()
SMOLLM_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SIZE = SMOLLM_FILE.stat().st_size
AWQ_CONFIG = {
    "model_type": "llama",
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "hidden_size": 64,
    "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128},
}


def repos() -> dict[str, FakeRepo]:
    return {
        "acme/smol-gguf": FakeRepo({SMOLLM_NAME: SMOLLM_FILE, "README.md": b"# SmolLM2"}),
        "acme/awq": FakeRepo(
            {"config.json": json.dumps(AWQ_CONFIG).encode(), "model.safetensors": b"\0" * 8192}
        ),
    }


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    fake = FakeHub(repos=repos()).start()
    yield fake
    fake.stop()


def pull_settings(hub: FakeHub, cache: Path, **overrides: object) -> object:
    values: dict[str, object] = {
        "hf_cache_dir": cache,
        "hf_offline": False,
        "hf_endpoint": hub.url,
        "hf_token": None,
        "allow_pull": True,
    }
    return make_settings(**{**values, **overrides})


def pull(stub: pb_grpc.InferenceStub, model: str) -> list[pb.PullResponse]:
    return list(stub.Pull(pb.PullRequest(model=model)))


def snapshot_file(cache: Path, commit: str) -> Path:
    return cache / "models--acme--smol-gguf" / "snapshots" / commit / SMOLLM_NAME


def test_a_pull_streams_progress_and_the_model_then_serves(hub: FakeHub, tmp_path: Path) -> None:
    with serving(pull_settings(hub, tmp_path)) as (_, stub):  # type: ignore[arg-type]
        # Admission reads the header first (kept per commit, so the pull reads it no more).
        assert stub.Admit(pb.AdmitRequest(model="acme/smol-gguf")).admitted
        header = hub.bytes_sent("acme/smol-gguf", SMOLLM_NAME)
        events = pull(stub, "acme/smol-gguf")
        kinds = [event.WhichOneof("event") for event in events]
        assert kinds[0] == "started"
        assert kinds[-1] == "finished"
        assert set(kinds[1:-1]) == {"progress"}
        started = events[0].started
        assert [f.path for f in started.download.files] == [SMOLLM_NAME]  # not the README
        assert started.download.total_bytes == SIZE
        done = [event.progress.bytes_done for event in events[1:-1]]
        assert done == sorted(done)
        assert done[-1] == SIZE
        assert all(event.progress.bytes_total == SIZE for event in events[1:-1])
        finished = events[-1].finished
        assert finished.bytes_transferred == SIZE
        assert finished.admit.admitted, finished.admit.reason
        assert finished.admit.available_locally
        # In the standard cache layout, whole, and fetched once.
        commit = hub.repos["acme/smol-gguf"].commit
        assert snapshot_file(tmp_path, commit).read_bytes() == SMOLLM_FILE.read_bytes()
        assert hub.bytes_sent("acme/smol-gguf", SMOLLM_NAME) == header + SIZE
        assert hub.bytes_sent("acme/smol-gguf", "README.md") == 0
        reply = collect(
            stub.Generate(pb.GenerateRequest(model="acme/smol-gguf", prompt="Hi", max_tokens=2))
        )
        assert finished_of(reply).usage.completion_tokens == 2
        # Asked again: already there, nothing moves.
        again = pull(stub, "acme/smol-gguf")
        assert again[-1].finished.bytes_transferred == 0
        assert hub.bytes_sent("acme/smol-gguf", SMOLLM_NAME) == header + SIZE


def test_what_admission_refuses_is_not_pulled(hub: FakeHub, tmp_path: Path) -> None:
    with serving(pull_settings(hub, tmp_path)) as (_, stub):  # type: ignore[arg-type]
        with pytest.raises(grpc.RpcError) as caught:
            pull(stub, "acme/awq")
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "awq" in str(caught.value.details())
        assert hub.bytes_sent("acme/awq", "model.safetensors") == 0
        with pytest.raises(grpc.RpcError) as caught:
            pull(stub, "acme/missing")
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize(
    ("overrides", "says"),
    [({"allow_pull": False}, "--allow-pull"), ({"hf_offline": True}, "offline")],
)
def test_pulling_is_the_operators_choice(
    hub: FakeHub, tmp_path: Path, overrides: dict[str, object], says: str
) -> None:
    settings = pull_settings(hub, tmp_path, **overrides)
    with serving(settings) as (_, stub), pytest.raises(grpc.RpcError) as caught:  # type: ignore[arg-type]
        pull(stub, "acme/smol-gguf")
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert says in str(caught.value.details())
    assert hub.bytes_sent("acme/smol-gguf") == 0


def test_concurrent_pulls_share_one_transfer(tmp_path: Path) -> None:
    slow = FakeHub(repos=repos(), bytes_per_second=100e6).start()
    try:
        with serving(pull_settings(slow, tmp_path)) as (_, stub):  # type: ignore[arg-type]
            results: list[list[pb.PullResponse]] = []

            def one() -> None:
                results.append(pull(stub, "acme/smol-gguf"))

            threads = [threading.Thread(target=one) for _ in range(2)]
            for thread in threads:
                thread.start()
                time.sleep(0.2)  # the second joins while the first is under way
            for thread in threads:
                thread.join(timeout=60)
        assert len(results) == 2
        assert all(events[-1].finished.admit.available_locally for events in results)
        # One transfer, beside the header admission read once.
        assert SIZE < slow.bytes_sent("acme/smol-gguf", SMOLLM_NAME) < 2 * SIZE
    finally:
        slow.stop()


def test_a_cancelled_pull_is_resumed_by_the_next(tmp_path: Path) -> None:
    """The partial file stays (never served); the next pull asks only for the rest."""
    slow = FakeHub(repos=repos(), bytes_per_second=40e6).start()
    commit = slow.repos["acme/smol-gguf"].commit
    sha256 = slow.repos["acme/smol-gguf"].sha256[SMOLLM_NAME]
    blobs = tmp_path / "models--acme--smol-gguf" / "blobs"
    try:
        with serving(pull_settings(slow, tmp_path)) as (_, stub):  # type: ignore[arg-type]
            stub.Admit(pb.AdmitRequest(model="acme/smol-gguf"))  # the header, read once
            header = slow.bytes_sent("acme/smol-gguf", SMOLLM_NAME)
            stream = stub.Pull(pb.PullRequest(model="acme/smol-gguf"))
            for event in stream:
                if event.WhichOneof("event") == "progress" and event.progress.bytes_done > 0:
                    break
            stream.cancel()
            time.sleep(1.0)  # the transfer stops at its next chunk
            stopped_at = slow.bytes_sent("acme/smol-gguf", SMOLLM_NAME)
            time.sleep(0.5)
            assert slow.bytes_sent("acme/smol-gguf", SMOLLM_NAME) == stopped_at < header + SIZE
            assert not snapshot_file(tmp_path, commit).exists()
            partial = blobs / f"{sha256}.incomplete"
            kept = partial.stat().st_size
            assert 0 < kept < SIZE
            assert [p.name for p in blobs.iterdir()] == [partial.name]  # no blob in place
            admit = stub.Admit(pb.AdmitRequest(model="acme/smol-gguf"))
            assert not admit.available_locally
            events = pull(stub, "acme/smol-gguf")
            assert events[0].started.cached_bytes == kept
            finished = events[-1].finished
            assert finished.admit.available_locally
            assert finished.bytes_transferred == SIZE - kept
            # The hub served the rest only, and the file is whole.
            assert slow.bytes_sent("acme/smol-gguf", SMOLLM_NAME) - stopped_at == SIZE - kept
            assert snapshot_file(tmp_path, commit).read_bytes() == SMOLLM_FILE.read_bytes()
            assert [p.name for p in blobs.iterdir()] == [sha256]
    finally:
        slow.stop()


def test_the_client_pulls_with_a_progress_bar(
    hub: FakeHub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with serving(pull_settings(hub, tmp_path)) as (running, _):  # type: ignore[arg-type]
        code = main(["--target", running.target, "pull", "acme/smol-gguf"])
    out, err = capsys.readouterr()
    assert code == 0
    assert json.loads(out)["bytesTransferred"] == str(SIZE)
    assert "pulling acme/smol-gguf at" in err
    assert "100%" in err  # tqdm's bar, finished


NODE = shutil.which("node")
NODE_CLIENT = Path(__file__).resolve().parent.parent / "clients" / "node"


@pytest.mark.skipif(NODE is None, reason="Node.js is not installed")
def test_the_node_client_pulls_with_a_progress_bar(hub: FakeHub, tmp_path: Path) -> None:
    assert NODE is not None
    if not (NODE_CLIENT / "node_modules").exists():
        pytest.fail("the Node.js client's npm packages are missing: run `make install`")
    with serving(pull_settings(hub, tmp_path)) as (running, _):  # type: ignore[arg-type]
        command = [NODE, str(NODE_CLIENT / "src" / "cli.mjs"), "pull", "acme/smol-gguf"]
        done = subprocess.run(
            [*command, "--target", running.target], capture_output=True, text=True, timeout=120
        )
    assert done.returncode == 0, done.stderr
    finished = json.loads(done.stdout)
    assert finished["bytesTransferred"] == str(SIZE)
    assert finished["admit"]["availableLocally"]
    assert "pulling acme/smol-gguf at" in done.stderr
    assert f"100% | {SIZE}/{SIZE} bytes" in done.stderr  # cli-progress's bar, finished


def test_pull_on_demand_makes_generate_pull_first(hub: FakeHub, tmp_path: Path) -> None:
    settings = pull_settings(hub, tmp_path, pull_on_demand=True)
    with serving(settings) as (_, stub):  # type: ignore[arg-type]
        request = pb.GenerateRequest(model="acme/smol-gguf", prompt="Hi", max_tokens=2)
        first = collect(stub.Generate(request))
        kinds = [event.WhichOneof("event") for event in first]
        # The pull speaks before the generation starts: the client hears no silence.
        at = kinds.index("started")
        assert at > 0
        assert set(kinds[:at]) == {"pull_progress"}
        progress = [event.pull_progress for event in first[:at]]
        assert progress[0].bytes_total == SIZE
        assert progress[-1].bytes_done == SIZE
        assert [p.bytes_done for p in progress] == sorted(p.bytes_done for p in progress)
        started = first[at].started
        assert started.pulled_bytes == SIZE
        assert 0 < started.pull_ms <= finished_of(first).timing.ttft_ms
        assert finished_of(first).usage.completion_tokens == 2
        again = collect(stub.Generate(request))
        assert again[0].WhichOneof("event") == "started"
        assert (again[0].started.pull_ms, again[0].started.pulled_bytes) == (0, 0)
    with pytest.raises(ValueError, match="needs allow_pull"):
        make_settings(allow_pull=False, pull_on_demand=True)


def test_a_pulled_mlx_checkpoint_serves(tmp_path: Path) -> None:
    """The files chosen for a checkpoint are all mlx-lm needs: a real tiny one, pulled
    into an empty cache, then generating."""
    from tests.mlx_checkpoint import build_tiny_checkpoint  # mlx: imported where needed

    checkpoint = build_tiny_checkpoint(tmp_path / "tiny")
    files: dict[str, bytes | Path] = {p.name: p for p in checkpoint.iterdir() if p.is_file()}
    files["README.md"] = b"# not needed"
    fake = FakeHub(repos={"acme/tiny-mlx": FakeRepo(files)}).start()
    try:
        with serving(pull_settings(fake, tmp_path / "cache")) as (_, stub):  # type: ignore[arg-type]
            events = pull(stub, "acme/tiny-mlx")
            finished = events[-1].finished
            assert finished.admit.admitted, finished.admit.reason
            assert finished.admit.backend == "mlx-lm"
            fetched = {f.path for f in events[0].started.download.files}
            assert "README.md" not in fetched
            assert {"config.json", "model.safetensors"} <= fetched
            request = pb.GenerateRequest(model="acme/tiny-mlx", prompt="hello", max_tokens=3)
            assert finished_of(collect(stub.Generate(request))).usage.completion_tokens > 0
    finally:
        fake.stop()


def test_a_pulled_diffusers_pipeline_renders(tmp_path: Path) -> None:
    """A real tiny Stable Diffusion pipeline: its component folders are pulled (the
    ones model_index.json names), and GenerateImage renders from the cache."""
    from tests.tiny_pipeline import build_tiny_sd_pipeline  # torch: imported where needed

    pipeline = build_tiny_sd_pipeline(tmp_path / "tiny-sd")
    files: dict[str, bytes | Path] = {
        p.relative_to(pipeline).as_posix(): p for p in pipeline.rglob("*") if p.is_file()
    }
    files["samples/preview.bin"] = b"\0" * 64  # in no component: left behind
    fake = FakeHub(repos={"acme/tiny-sd": FakeRepo(files)}).start()
    try:
        with serving(pull_settings(fake, tmp_path / "cache")) as (_, stub):  # type: ignore[arg-type]
            request = pb.PullRequest(model="acme/tiny-sd", capability=pb.CAPABILITY_IMAGE)
            events = list(stub.Pull(request))
            finished = events[-1].finished
            assert finished.admit.admitted, finished.admit.reason
            assert finished.admit.backend == "diffusers"
            fetched = {f.path for f in events[0].started.download.files}
            assert fetched == set(files) - {"samples/preview.bin"}
            image = list(
                stub.GenerateImage(
                    pb.GenerateImageRequest(
                        model="acme/tiny-sd", prompt="a red apple", width=64, height=32, steps=2
                    )
                )
            )[-1].image
            assert (image.width, image.height) == (64, 32)
    finally:
        fake.stop()


def test_a_pull_waits_for_another_process_writing_the_same_blob(
    hub: FakeHub, tmp_path: Path
) -> None:
    """The blob's lock is huggingface_hub's: another server or `hf download` writing the
    same file into a shared cache is waited for, not raced."""
    sha256 = hub.repos["acme/smol-gguf"].sha256[SMOLLM_NAME]
    lock_path = tmp_path / ".locks" / "models--acme--smol-gguf" / f"{sha256}.lock"
    lock_path.parent.mkdir(parents=True)
    with serving(pull_settings(hub, tmp_path)) as (_, stub):  # type: ignore[arg-type]
        stub.Admit(pb.AdmitRequest(model="acme/smol-gguf"))
        header = hub.bytes_sent("acme/smol-gguf", SMOLLM_NAME)
        results: list[list[pb.PullResponse]] = []
        with FileLock(lock_path):  # what huggingface_hub holds while it downloads
            puller = threading.Thread(target=lambda: results.append(pull(stub, "acme/smol-gguf")))
            puller.start()
            time.sleep(1.5)
            assert hub.bytes_sent("acme/smol-gguf", SMOLLM_NAME) == header
            assert not results
        puller.join(timeout=60)
        assert results[0][-1].finished.admit.available_locally
        assert hub.bytes_sent("acme/smol-gguf", SMOLLM_NAME) == header + SIZE
