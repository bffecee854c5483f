"""Pulls on a small disk: room promised among concurrent pulls, and a disk that fills.

The hub cache lies on a tmpfs of its own (mounting one needs root, which CI
has; the tests are skipped where the machine cannot mount), so filling it
fills nothing else.
"""

from __future__ import annotations

import errno
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from service.models.embedded import EMBEDDED_MODELS
from tests.conftest import SMOLLM, collect, finished_of, make_settings, serving
from tests.fake_hub import FakeHub, FakeRepo

SMOLLM_BYTES = EMBEDDED_MODELS[SMOLLM].locate().read_bytes()
SIZE = len(SMOLLM_BYTES)
NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Room for one model and a half: each pull fits alone, two do not.
DISK_BYTES = SIZE * 3 // 2


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "disk"
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES}", "tmpfs", str(folder)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    # Two models with the same header (both admitted) and different bytes.
    fake = FakeHub(
        repos={
            "acme/a": FakeRepo({NAME: SMOLLM_BYTES}),
            "acme/b": FakeRepo({NAME: SMOLLM_BYTES + b"\0" * 4096}),
        },
        bytes_per_second=40e6,
    ).start()
    yield fake
    fake.stop()


def _server(hub: FakeHub, cache: Path) -> object:
    settings = make_settings(
        hf_cache_dir=cache, hf_offline=False, hf_endpoint=hub.url, hf_token=None, allow_pull=True
    )
    return serving(settings)


def _wait_for_bytes(stream: Iterator[pb.PullResponse]) -> None:
    for event in stream:
        if event.WhichOneof("event") == "progress" and event.progress.file_bytes_done > 0:
            return


def _still_serving(stub: pb_grpc.InferenceStub) -> None:
    reply = collect(stub.Generate(pb.GenerateRequest(prompt="Hello", max_tokens=1)))
    assert finished_of(reply).usage.completion_tokens == 1


def test_a_pull_that_cannot_fit_beside_one_under_way_is_refused_before_it_starts(
    small_disk: Path, hub: FakeHub
) -> None:
    with _server(hub, small_disk / "cache") as (_, stub):  # type: ignore[attr-defined]
        stub.Admit(pb.AdmitRequest(model="acme/b"))  # b's header, read before the count
        first = stub.Pull(pb.PullRequest(model="acme/a"))
        _wait_for_bytes(first)
        before = hub.bytes_sent("acme/b", NAME)
        with pytest.raises(grpc.RpcError) as caught:
            list(stub.Pull(pb.PullRequest(model="acme/b")))
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "promised to pulls under way" in str(caught.value.details())
        assert hub.bytes_sent("acme/b", NAME) == before  # not one byte of b's body
        finished = [event for event in first if event.WhichOneof("event") == "finished"]
        assert finished[0].finished.admit.available_locally  # the first one is unharmed
        _still_serving(stub)


def test_a_disk_that_fills_midway_is_named_and_given_back(small_disk: Path, hub: FakeHub) -> None:
    cache = small_disk / "cache"
    with _server(hub, cache) as (_, stub):  # type: ignore[attr-defined]
        stream = stub.Pull(pb.PullRequest(model="acme/a"))
        _wait_for_bytes(stream)
        filler = threading.Thread(target=_fill, args=(small_disk / "filler",))
        filler.start()
        with pytest.raises(grpc.RpcError) as caught:
            list(stream)
        filler.join()
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        details = str(caught.value.details())
        assert f"mounted at {small_disk}" in details
        assert "is full" in details
        blobs = cache / "models--acme--a" / "blobs"
        assert list(blobs.iterdir()) == []  # the partial file is given back too
        assert not stub.Admit(pb.AdmitRequest(model="acme/a")).available_locally
        _still_serving(stub)
        # With room again, the pull completes.
        (small_disk / "filler").unlink()
        finished = list(stub.Pull(pb.PullRequest(model="acme/a")))[-1].finished
        assert finished.admit.available_locally


def _fill(path: Path) -> None:
    """Write until the disk is full (another program taking the space mid-pull)."""
    block = b"\0" * (1 << 20)
    with open(path, "wb", buffering=0) as file:
        try:
            while True:
                file.write(block)
        except OSError as exc:  # full: the file keeps the space until the test deletes it
            if exc.errno != errno.ENOSPC:
                raise
