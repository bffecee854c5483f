"""Pulls from a hub that lies, breaks or attacks (issue 26).

One server pulls from a loopback hub whose repos each misbehave one way
(tests/fake_hub.py's `Hostile`). For each: the status and its message,
nothing created outside the cache (the folder around it is walked), nothing
half-written served, and the server still serving.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from service.models.embedded import EMBEDDED_MODELS
from tests.conftest import SMOLLM, collect, finished_of, make_settings, serving
from tests.fake_hub import FakeHub, FakeRepo, Hostile

SMOLLM_FILE = EMBEDDED_MODELS[SMOLLM].locate()
SMOLLM_BYTES = SMOLLM_FILE.read_bytes()
SIZE = len(SMOLLM_BYTES)
NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CONFIG = json.dumps({"model_type": "llama"}).encode()  # a small (non-LFS) file


def _flipped(data: bytes) -> bytes:
    """The same length, one byte different: only a hash tells them apart."""
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1 :]


def _repos(outside: Path) -> dict[str, FakeRepo]:
    def smol(hostile: Hostile, **files: bytes) -> FakeRepo:
        return FakeRepo({NAME: SMOLLM_BYTES, **files}, hostile=hostile)

    return {
        "acme/etag-absolute": smol(Hostile(etag=str(outside / "absolute"))),
        "acme/etag-parent": smol(Hostile(etag="../../../../escaped")),
        "acme/wrong-bytes": smol(Hostile(body={NAME: _flipped(SMOLLM_BYTES)})),
        "acme/long-listing": smol(Hostile(listed_size={NAME: SIZE + 4096})),
        "acme/cut-once": smol(Hostile(script=["cut:5000000"])),
        "acme/cut-then-500": smol(
            Hostile(script=["cut:3000000", "status:500", "status:500", "status:500"])
        ),
        "acme/forbidden": smol(Hostile(status=403)),
        "acme/names-parent": FakeRepo({"../../escaped.gguf": SMOLLM_BYTES}),
        "acme/names-absolute": FakeRepo({NAME: SMOLLM_BYTES, "/etc/escaped": b"x"}),
        "acme/names-dot": FakeRepo({NAME: SMOLLM_BYTES, "a/./b.txt": b"x"}),
        "acme/fine": smol(Hostile()),
    }


@pytest.fixture(scope="module")
def around(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder around the cache: nothing may appear in it but the cache."""
    folder = tmp_path_factory.mktemp("around")
    (folder / "outside").mkdir()
    return folder


@pytest.fixture(scope="module")
def hub(around: Path) -> Iterator[FakeHub]:
    fake = FakeHub(repos=_repos(around / "outside")).start()
    yield fake
    fake.stop()


@pytest.fixture(scope="module")
def stub(hub: FakeHub, around: Path) -> Iterator[pb_grpc.InferenceStub]:
    settings = make_settings(
        hf_cache_dir=around / "cache",
        hf_offline=False,
        hf_endpoint=hub.url,
        hf_token=None,
        allow_pull=True,
    )
    with serving(settings) as (_, client):
        yield client


def _pull_error(stub: pb_grpc.InferenceStub, model: str) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        list(stub.Pull(pb.PullRequest(model=model)))
    return caught.value


def _outside_cache(around: Path) -> list[str]:
    """Every file or folder around the cache that is not inside it."""
    found = []
    for folder, folders, files in os.walk(around):
        for name in folders + files:
            path = Path(folder, name)
            if path != around / "cache" and around / "cache" not in path.parents:
                found.append(str(path.relative_to(around)))
    return sorted(found)


def _files(around: Path, repo: str) -> list[str]:
    """What the cache holds for a repo, snapshots and blobs, partial files included."""
    folder = around / "cache" / f"models--{repo.replace('/', '--')}"
    return sorted(
        str(Path(root, name).relative_to(folder))
        for root, _, names in os.walk(folder)
        for name in names
    )


def _still_serving(stub: pb_grpc.InferenceStub) -> None:
    reply = collect(stub.Generate(pb.GenerateRequest(prompt="Hello", max_tokens=1)))
    assert finished_of(reply).usage.completion_tokens == 1


@pytest.mark.parametrize("repo", ["acme/etag-absolute", "acme/etag-parent"])
def test_a_path_shaped_etag_writes_nothing_anywhere(
    stub: pb_grpc.InferenceStub, around: Path, repo: str
) -> None:
    error = _pull_error(stub, repo)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "ETag" in str(error.details())
    assert "not a git or LFS hash" in str(error.details())
    assert _outside_cache(around) == ["outside"]
    assert not [name for name in _files(around, repo) if name.startswith("blobs/")]
    _still_serving(stub)


def test_bytes_that_differ_from_the_listed_hash_are_deleted(
    stub: pb_grpc.InferenceStub, around: Path, hub: FakeHub
) -> None:
    error = _pull_error(stub, "acme/wrong-bytes")
    assert error.code() == grpc.StatusCode.DATA_LOSS
    assert "sha256" in str(error.details())
    assert _files(around, "acme/wrong-bytes") == []  # no blob, no partial, no link
    admit = stub.Admit(pb.AdmitRequest(model="acme/wrong-bytes"))
    assert not admit.available_locally
    with pytest.raises(grpc.RpcError) as caught:
        list(stub.Generate(pb.GenerateRequest(model="acme/wrong-bytes", prompt="Hi", max_tokens=1)))
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    # The hub mends its ways: the next pull fetches the real bytes.
    hub.repos["acme/wrong-bytes"].hostile.body.clear()
    finished = list(stub.Pull(pb.PullRequest(model="acme/wrong-bytes")))[-1].finished
    assert finished.admit.available_locally
    assert finished.bytes_transferred == SIZE
    _still_serving(stub)


def test_a_cached_file_that_fails_its_hash_is_fetched_again(
    stub: pb_grpc.InferenceStub, around: Path, hub: FakeHub
) -> None:
    list(stub.Pull(pb.PullRequest(model="acme/fine")))
    sha256 = hub.repos["acme/fine"].sha256[NAME]
    blob = around / "cache" / "models--acme--fine" / "blobs" / sha256
    blob.write_bytes(_flipped(blob.read_bytes()))  # bit rot, or a tampered disk
    finished = list(stub.Pull(pb.PullRequest(model="acme/fine")))[-1].finished
    assert finished.bytes_transferred == SIZE
    assert blob.read_bytes() == SMOLLM_BYTES
    again = list(stub.Pull(pb.PullRequest(model="acme/fine")))[-1].finished
    assert again.bytes_transferred == 0


def test_a_listing_that_lies_about_a_size_is_refused_before_a_byte(
    stub: pb_grpc.InferenceStub, around: Path, hub: FakeHub
) -> None:
    before = hub.bytes_sent("acme/long-listing", NAME)
    error = _pull_error(stub, "acme/long-listing")
    assert error.code() == grpc.StatusCode.DATA_LOSS
    assert f"at {SIZE + 4096} bytes" in str(error.details())
    # What moved is at most the header admission read; nothing was kept.
    assert hub.bytes_sent("acme/long-listing", NAME) - before <= 2 << 20
    assert not [name for name in _files(around, "acme/long-listing") if "blobs/" in name]


def test_a_body_cut_short_is_resumed_within_the_pull(
    stub: pb_grpc.InferenceStub, around: Path, hub: FakeHub
) -> None:
    stub.Admit(pb.AdmitRequest(model="acme/cut-once"))  # the header, read once
    before = hub.bytes_sent("acme/cut-once", NAME)
    finished = list(stub.Pull(pb.PullRequest(model="acme/cut-once")))[-1].finished
    assert finished.admit.available_locally
    # The cut piece and the rest: every byte crossed once.
    assert hub.bytes_sent("acme/cut-once", NAME) - before == SIZE
    assert finished.bytes_transferred == SIZE


def test_a_pull_that_fails_midway_keeps_its_bytes_for_the_next(
    stub: pb_grpc.InferenceStub, around: Path, hub: FakeHub
) -> None:
    sha256 = hub.repos["acme/cut-then-500"].sha256[NAME]
    stub.Admit(pb.AdmitRequest(model="acme/cut-then-500"))
    before = hub.bytes_sent("acme/cut-then-500", NAME)
    error = _pull_error(stub, "acme/cut-then-500")
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert "the next pull continues" in str(error.details())
    assert _files(around, "acme/cut-then-500") == [f"blobs/{sha256}.incomplete"]
    assert not stub.Admit(pb.AdmitRequest(model="acme/cut-then-500")).available_locally
    events = list(stub.Pull(pb.PullRequest(model="acme/cut-then-500")))
    assert events[0].started.cached_bytes == 3_000_000
    assert events[-1].finished.bytes_transferred == SIZE - 3_000_000
    assert hub.bytes_sent("acme/cut-then-500", NAME) - before == SIZE  # none twice


def test_a_bare_403_is_permission_denied(stub: pb_grpc.InferenceStub, around: Path) -> None:
    error = _pull_error(stub, "acme/forbidden")
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "403" in str(error.details())
    assert not [name for name in _files(around, "acme/forbidden") if "blobs/" in name]


@pytest.mark.parametrize("repo", ["acme/names-parent", "acme/names-absolute", "acme/names-dot"])
def test_hostile_file_names_are_refused_before_anything_is_written(
    stub: pb_grpc.InferenceStub, around: Path, hub: FakeHub, repo: str
) -> None:
    error = _pull_error(stub, repo)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a path inside the repo" in str(error.details())
    with pytest.raises(grpc.RpcError) as caught:
        stub.Admit(pb.AdmitRequest(model=repo))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert hub.bytes_sent(repo) == 0
    assert _files(around, repo) == []
    assert _outside_cache(around) == ["outside"]
    _still_serving(stub)
