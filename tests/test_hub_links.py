"""Links planted in the hub cache by another local account lead nowhere (issue 38).

Someone who may write in the cache (another account sharing it, a compromised
tool) plants a symbolic or a hard link where a pull writes or a deletion
removes, pointing at a file of theirs to overwrite or of ours to destroy.
Before, a partial file that was a link was written through (the outside file
became the download) and deleting a revision whose snapshot held a link to an
outside file deleted that file. For every place the cache writes or deletes:
the outside file is untouched, and the answer is either the pull going on (the
link removed as a link) or a clear status naming the path, never INTERNAL.

Also here: the statuses that name a cause (a read-only or unwritable cache, a
repo deleted mid-pull), and deleting a loaded model's files.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from service.hub.disk import cache_failure
from tests.conftest import collect, finished_of, make_settings, serving
from tests.fake_hub import FakeHub, FakeRepo

NAME = "tiny.gguf"
SECRET = b"the other account's file: must survive\n"
REPOS = [
    "acme/partial-symlink",
    "acme/partial-hardlink",
    "acme/lock-symlink",
    "acme/blob-symlink",
    "acme/folder-symlink",
    "acme/blobs-symlink",
    "acme/snapshot-symlink",
    "acme/delete-snapshot-link",
    "acme/delete-folder-link",
    "acme/delete-inner-link",
    "acme/loaded",
    "acme/readonly",
    "acme/vanishing",
]


@pytest.fixture(scope="module")
def model_bytes(tiny_model: Path) -> bytes:
    """A tiny llama-shaped GGUF with a real vocabulary: loads, and pulls in a blink."""
    return tiny_model.read_bytes()


@pytest.fixture(scope="module")
def hub(model_bytes: bytes) -> Iterator[FakeHub]:
    fake = FakeHub(repos={repo: FakeRepo({NAME: model_bytes}) for repo in REPOS}).start()
    yield fake
    fake.stop()


@pytest.fixture(scope="module")
def around(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("around")


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


def _victim(around: Path, name: str) -> Path:
    """A file outside the cache that a link will point at."""
    folder = around / "outside"
    folder.mkdir(exist_ok=True)
    victim = folder / name
    victim.write_bytes(SECRET)
    return victim


def _folder(around: Path, repo: str) -> Path:
    return around / "cache" / f"models--{repo.replace('/', '--')}"


def _pull(stub: pb_grpc.InferenceStub, model: str) -> pb.PullFinished:
    finished: pb.PullFinished = list(stub.Pull(pb.PullRequest(model=model)))[-1].finished
    return finished


def _pull_error(stub: pb_grpc.InferenceStub, model: str) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        list(stub.Pull(pb.PullRequest(model=model)))
    return caught.value


def _blob(hub: FakeHub, around: Path, repo: str) -> Path:
    return _folder(around, repo) / "blobs" / hub.repos[repo].sha256[NAME]


def _pulled_whole(hub: FakeHub, around: Path, repo: str, model_bytes: bytes) -> None:
    blob = _blob(hub, around, repo)
    assert stat.S_ISREG(os.lstat(blob).st_mode)  # a file of the cache's own, not a link
    assert blob.read_bytes() == model_bytes
    snapshot = _folder(around, repo) / "snapshots" / hub.repos[repo].commit / NAME
    assert snapshot.read_bytes() == model_bytes


# --- where a pull writes ------------------------------------------------------------


@pytest.mark.parametrize("kind", ["symlink", "hardlink"])
def test_a_partial_file_planted_as_a_link_is_replaced_not_written_through(
    stub: pb_grpc.InferenceStub, hub: FakeHub, around: Path, model_bytes: bytes, kind: str
) -> None:
    repo = f"acme/partial-{kind}"
    victim = _victim(around, f"partial-{kind}")
    partial = Path(f"{_blob(hub, around, repo)}.incomplete")
    partial.parent.mkdir(parents=True)
    if kind == "symlink":
        partial.symlink_to(victim)
    else:
        os.link(victim, partial)
    assert _pull(stub, repo).bytes_transferred == len(model_bytes)
    assert victim.read_bytes() == SECRET
    _pulled_whole(hub, around, repo, model_bytes)


def test_a_lock_planted_as_a_link_is_replaced(
    stub: pb_grpc.InferenceStub, hub: FakeHub, around: Path, model_bytes: bytes
) -> None:
    repo = "acme/lock-symlink"
    victim = _victim(around, "lock")
    sha = hub.repos[repo].sha256[NAME]
    lock = around / "cache" / ".locks" / _folder(around, repo).name / f"{sha}.lock"
    lock.parent.mkdir(parents=True)
    lock.symlink_to(victim)
    _pull(stub, repo)
    assert victim.read_bytes() == SECRET
    _pulled_whole(hub, around, repo, model_bytes)


def test_a_blob_planted_as_a_link_to_a_right_copy_is_fetched_as_a_file(
    stub: pb_grpc.InferenceStub, hub: FakeHub, around: Path, model_bytes: bytes
) -> None:
    """Even a link to a file with the right bytes is not the cache's: never served."""
    repo = "acme/blob-symlink"
    copy = around / "outside" / "copy.gguf"
    copy.parent.mkdir(exist_ok=True)
    copy.write_bytes(model_bytes)
    blob = _blob(hub, around, repo)
    blob.parent.mkdir(parents=True)
    blob.symlink_to(copy)
    assert _pull(stub, repo).bytes_transferred == len(model_bytes)
    assert copy.read_bytes() == model_bytes
    _pulled_whole(hub, around, repo, model_bytes)


@pytest.mark.parametrize(
    ("repo", "planted"),
    [
        ("acme/folder-symlink", ""),
        ("acme/blobs-symlink", "blobs"),
        ("acme/snapshot-symlink", "snapshots/{commit}"),
    ],
)
def test_a_folder_planted_as_a_link_out_of_the_cache_is_permission_denied(
    stub: pb_grpc.InferenceStub, hub: FakeHub, around: Path, repo: str, planted: str
) -> None:
    outside = around / "outside" / f"folder-{repo.split('/')[1]}"
    outside.mkdir(parents=True)
    link = _folder(around, repo) / planted.format(commit=hub.repos[repo].commit)
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(outside, target_is_directory=True)
    error = _pull_error(stub, repo)
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "leads outside" in str(error.details())
    assert list(outside.iterdir()) == []  # nothing written there


# --- where a deletion removes -------------------------------------------------------


def test_deleting_a_revision_with_a_link_out_removes_the_link_only(
    stub: pb_grpc.InferenceStub, hub: FakeHub, around: Path
) -> None:
    repo = "acme/delete-snapshot-link"
    _pull(stub, repo)
    victim = _victim(around, "snapshot-target")
    commit = hub.repos[repo].commit
    (_folder(around, repo) / "snapshots" / commit / "planted.gguf").symlink_to(victim)
    deleted = stub.DeleteCached(pb.DeleteCachedRequest(model=f"{repo}@{commit}"))
    assert list(deleted.commits) == [commit]
    assert victim.read_bytes() == SECRET
    assert not (_folder(around, repo) / "snapshots" / commit).exists()
    assert not _blob(hub, around, repo).exists()
    # What the file system gave back: the blob's blocks, not the outside file's.
    assert 0 < deleted.freed_bytes < 2 * len(hub.repos[repo].data[NAME])


def test_deleting_a_repo_whose_folder_is_a_link_is_permission_denied(
    stub: pb_grpc.InferenceStub, around: Path
) -> None:
    repo = "acme/delete-folder-link"
    outside = around / "outside" / "repo-folder"
    (outside / "blobs").mkdir(parents=True)
    (outside / "blobs" / "keep").write_bytes(SECRET)
    _folder(around, repo).symlink_to(outside, target_is_directory=True)
    with pytest.raises(grpc.RpcError) as caught:
        stub.DeleteCached(pb.DeleteCachedRequest(model=repo))
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert str(_folder(around, repo)) in str(caught.value.details())
    assert (outside / "blobs" / "keep").read_bytes() == SECRET


def test_deleting_a_repo_removes_links_inside_it_as_links(
    stub: pb_grpc.InferenceStub, hub: FakeHub, around: Path
) -> None:
    repo = "acme/delete-inner-link"
    _pull(stub, repo)
    victim = _victim(around, "inner-target")
    (_folder(around, repo) / "blobs" / "planted").symlink_to(victim)
    os.link(victim, _folder(around, repo) / "blobs" / "planted-hard")
    stub.DeleteCached(pb.DeleteCachedRequest(model=repo))
    assert not os.path.lexists(_folder(around, repo))
    assert victim.read_bytes() == SECRET


# --- deleting a loaded model ----------------------------------------------------------


def test_deleting_a_loaded_models_files_unloads_it_first(
    stub: pb_grpc.InferenceStub, hub: FakeHub, around: Path
) -> None:
    repo = "acme/loaded"
    _pull(stub, repo)
    request = pb.GenerateRequest(model=repo, prompt="Hello", max_tokens=2)
    assert finished_of(collect(stub.Generate(request))).usage.completion_tokens == 2
    loaded = {
        model.name for model in stub.ListModels(pb.ListModelsRequest()).models if model.loaded
    }
    assert repo in loaded
    deleted = stub.DeleteCached(pb.DeleteCachedRequest(model=repo))
    assert deleted.freed_bytes > 0
    listed = stub.ListModels(pb.ListModelsRequest()).models
    assert repo not in {model.name for model in listed if model.loaded}
    with pytest.raises(grpc.RpcError) as caught:  # nothing serves from a deleted file
        list(stub.Generate(request))
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION


# --- statuses that name the cause ---------------------------------------------------


@pytest.fixture
def unwritable_cache(tmp_path: Path) -> Iterator[Path]:
    """A cache this process cannot write: a read-only mount where it may mount one
    (root), else a folder without write permission (anyone else)."""
    cache = tmp_path / "cache"
    cache.mkdir()
    if os.geteuid() != 0:
        cache.chmod(0o555)
        yield cache
        cache.chmod(0o755)
        return
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=256m", "tmpfs", str(cache)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"root here may not mount a read-only tmpfs: {mounted.stderr!r}")
    try:
        yield cache
    finally:
        subprocess.run(["umount", str(cache)], check=True)


def test_an_unwritable_cache_is_failed_precondition_naming_the_fix(
    hub: FakeHub, unwritable_cache: Path
) -> None:
    settings = make_settings(
        hf_cache_dir=unwritable_cache,
        hf_offline=False,
        hf_endpoint=hub.url,
        hf_token=None,
        allow_pull=True,
    )
    with serving(settings) as (_, stub):
        error = _pull_error(stub, "acme/readonly")
        assert finished_of(collect(stub.Generate(pb.GenerateRequest(prompt="Hi", max_tokens=1))))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "--hf-cache-dir" in str(error.details())
    assert str(unwritable_cache) in str(error.details())


def test_a_repo_deleted_mid_pull_is_aborted_with_retry(model_bytes: bytes, tmp_path: Path) -> None:
    """Another server (or `hf cache delete`) removes the folder under a running pull."""
    slow = FakeHub(repos={"acme/vanishing": FakeRepo({NAME: model_bytes})}, bytes_per_second=2e6)
    slow.start()
    cache = tmp_path / "cache"
    settings = make_settings(
        hf_cache_dir=cache, hf_offline=False, hf_endpoint=slow.url, hf_token=None, allow_pull=True
    )
    folder = cache / "models--acme--vanishing"
    try:
        with serving(settings) as (_, stub):
            pull = stub.Pull(pb.PullRequest(model="acme/vanishing"))
            for step in pull:  # until bytes are on disk
                if step.WhichOneof("event") == "progress" and step.progress.file_bytes_done:
                    break
            shutil.rmtree(folder)
            with pytest.raises(grpc.RpcError) as caught:
                list(pull)
            assert caught.value.code() == grpc.StatusCode.ABORTED
            assert "retry" in str(caught.value.details())
            assert _pull(stub, "acme/vanishing").bytes_transferred == len(model_bytes)
    finally:
        slow.stop()


@pytest.mark.parametrize(
    ("error", "status", "says"),
    [
        (errno.EROFS, grpc.StatusCode.FAILED_PRECONDITION, "read-only file system"),
        (errno.EACCES, grpc.StatusCode.FAILED_PRECONDITION, "may not write"),
        (errno.EPERM, grpc.StatusCode.FAILED_PRECONDITION, "may not write"),
        (errno.ENOENT, grpc.StatusCode.ABORTED, "retry the pull"),
        (errno.ENOSPC, grpc.StatusCode.RESOURCE_EXHAUSTED, "is full"),
    ],
)
def test_what_the_cache_file_system_says_is_named(
    tmp_path: Path, error: int, status: grpc.StatusCode, says: str
) -> None:
    failure = cache_failure(OSError(error, os.strerror(error), str(tmp_path / "x")), tmp_path, "p")
    assert failure is not None
    assert failure.code == status
    assert says in failure.message


def test_an_error_the_cache_cannot_explain_is_left_alone(tmp_path: Path) -> None:
    assert cache_failure(OSError(errno.EIO, "I/O error"), tmp_path, "pulling") is None
