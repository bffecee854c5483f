"""Every path under the hub cache is walked by directory descriptors, never through a link
(service.hub.dirfd, issue 45).

Checking a path, then using it by name, lost to a swap in between: with `blobs/` or the
repo's folder replaced by a link to an outside folder while a pull ran, a cut body's
retry wrote the whole file there. Here: the walk refuses a link anywhere on the way, a
folder opened before a swap is the one written, a tree is removed with its links as
links, and a real server's pull with a swap mid-body (tests/fake_hub.py, `Midway`) fails
PERMISSION_DENIED with nothing written outside.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from inference.v1 import inference_pb2 as pb
from service.errors import AccessDenied, InvalidRequest
from service.hub import dirfd
from service.hub.cache import RepoCache
from service.hub.dirfd import OutsideCache
from service.hub.trust import Digest
from tests.conftest import make_settings, serving
from tests.fake_hub import FakeHub, FakeRepo, Midway

SECRET = b"outside the cache: must survive\n"
NAME = "tiny.gguf"


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path]:
    """A cache root and, beside it, an outside folder holding a file to protect."""
    cache = tmp_path / "cache"
    cache.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_bytes(SECRET)
    return cache, outside


def _root(cache: Path) -> int:
    return dirfd.open_root(str(cache))


# --- the walk ------------------------------------------------------------------------


def test_a_walk_creates_folders_and_refuses_a_link_on_the_way(layout: tuple[Path, Path]) -> None:
    cache, outside = layout
    with dirfd.opened(_root(cache)) as root:
        with dirfd.folder(root, ["a", "b"], create=True, label=str(cache)):
            pass
        assert (cache / "a" / "b").is_dir()
        (cache / "a" / "link").symlink_to(outside, target_is_directory=True)
        for parts in (["a", "link"], ["a", "link", "deeper"]):
            with pytest.raises(OutsideCache) as refused:
                dirfd.open_folder(root, parts, create=True, label=str(cache))
            assert refused.value.message.startswith(f"{cache / 'a' / 'link'} in the hub cache")
            assert "leads outside" in refused.value.message
        with pytest.raises(FileNotFoundError):
            dirfd.open_folder(root, ["missing"], create=False, label=str(cache))
    assert sorted(p.name for p in outside.iterdir()) == ["victim"]


@pytest.mark.parametrize("name", ["", "/etc", "a/../b", "a//b", "./a", ".."])
def test_a_name_that_is_not_a_plain_path_below_is_refused(name: str) -> None:
    with pytest.raises(InvalidRequest):
        dirfd.parts_of(name)


def test_a_folder_opened_before_a_swap_is_the_one_written(layout: tuple[Path, Path]) -> None:
    """The swap after the opening: the descriptor still names the folder that was opened."""
    cache, outside = layout
    with dirfd.opened(_root(cache)) as root:
        with dirfd.folder(root, ["blobs"], create=True, label=str(cache)) as blobs:
            os.rename(cache / "blobs", cache / "moved")
            (cache / "blobs").symlink_to(outside, target_is_directory=True)
            descriptor = dirfd.open_file(blobs, "new", os.O_WRONLY | os.O_CREAT, label="new")
            os.close(descriptor)
        with pytest.raises(OutsideCache):  # walked again: the link is refused
            dirfd.open_folder(root, ["blobs"], create=False, label=str(cache))
    assert (cache / "moved" / "new").exists()
    assert sorted(p.name for p in outside.iterdir()) == ["victim"]


def test_a_file_opened_through_a_link_is_refused(layout: tuple[Path, Path]) -> None:
    cache, outside = layout
    (cache / "planted").symlink_to(outside / "victim")
    with dirfd.opened(_root(cache)) as root, pytest.raises(AccessDenied):
        dirfd.open_file(root, "planted", os.O_WRONLY | os.O_TRUNC, label="planted")
    assert (outside / "victim").read_bytes() == SECRET


def test_a_tree_is_removed_with_its_links_as_links(layout: tuple[Path, Path]) -> None:
    cache, outside = layout
    tree = cache / "tree" / "inner"
    tree.mkdir(parents=True)
    (tree / "file").write_bytes(b"x" * 10_000)
    (tree / "to-folder").symlink_to(outside, target_is_directory=True)
    (tree / "to-file").symlink_to(outside / "victim")
    os.link(outside / "victim", tree / "hard")
    with dirfd.opened(_root(cache)) as root:
        freed = dirfd.remove_tree(root, "tree")
    assert not (cache / "tree").exists()
    assert (outside / "victim").read_bytes() == SECRET
    assert 10_000 <= freed < 10_000 + 8192  # the one file's blocks, not the hard link's


def test_the_repo_cache_writes_nothing_through_a_swapped_blobs_folder(
    layout: tuple[Path, Path],
) -> None:
    cache, outside = layout
    repo = RepoCache(cache, "acme/x")
    repo.prepare()
    digest = Digest("sha256", "ab" * 32)
    folder = cache / "models--acme--x"
    os.rename(folder / "blobs", folder / "moved")
    (folder / "blobs").symlink_to(outside, target_is_directory=True)
    for write in (
        lambda: repo.open_partial(digest),
        lambda: repo.complete(digest),
        lambda: repo.remove_blob(digest),
        lambda: repo.partial_size(digest),
    ):
        with pytest.raises(OutsideCache):
            write()
    with pytest.raises(OutsideCache):  # a read is refused the same way
        repo.verified(digest, 0)
    assert sorted(p.name for p in outside.iterdir()) == ["victim"]


def test_a_ref_and_a_link_are_written_inside_through_descriptors(layout: tuple[Path, Path]) -> None:
    cache, outside = layout
    repo = RepoCache(cache, "acme/x")
    repo.prepare()
    commit = "0123456789abcdef0123456789abcdef01234567"
    digest = Digest("sha256", "cd" * 32)
    repo.write_ref("feature/one", commit)
    repo.link(commit, "sub/dir/model.gguf", digest)
    folder = cache / "models--acme--x"
    assert (folder / "refs" / "feature" / "one").read_text() == commit
    link = folder / "snapshots" / commit / "sub" / "dir" / "model.gguf"
    assert os.readlink(link) == f"../../../../blobs/{digest.hex}"
    assert repo.linked_blob(commit, "sub/dir/model.gguf") == digest.hex
    assert repo.read_ref("feature/one") == commit
    # A ref that holds a path is refused, never followed.
    (folder / "refs" / "main").write_text(str(outside))
    with pytest.raises(Exception, match="not a commit id"):
        repo.read_ref("main")


# --- a pull with a swap mid-body -----------------------------------------------------


@pytest.fixture(scope="module")
def model_bytes(tiny_model: Path) -> bytes:
    return tiny_model.read_bytes()


@pytest.fixture
def swapping_hub(model_bytes: bytes) -> Iterator[FakeHub]:
    fake = FakeHub(
        repos={
            "acme/swap-blobs": FakeRepo({NAME: model_bytes}),
            "acme/swap-folder": FakeRepo({NAME: model_bytes}),
        }
    ).start()
    yield fake
    fake.stop()


def _swap(folder: Path, outside: Path, partial: Path) -> None:
    """What another account with write access does, once the pull is writing its partial
    file (it writes through a buffer: what it holds is on disk when the cut closes it):
    the folder moved away, a link in its place."""
    deadline = time.monotonic() + 10
    while not partial.exists():
        assert time.monotonic() < deadline, "the pull never opened its partial file"
        time.sleep(0.01)
    os.rename(folder, folder.with_name(folder.name + ".moved"))
    folder.symlink_to(outside, target_is_directory=True)


@pytest.mark.parametrize(
    ("repo", "swapped"), [("acme/swap-blobs", "blobs"), ("acme/swap-folder", "")]
)
def test_a_folder_swapped_for_a_link_mid_body_gets_nothing_written_outside(
    swapping_hub: FakeHub, tmp_path: Path, model_bytes: bytes, repo: str, swapped: str
) -> None:
    cache = tmp_path / "cache"
    outside = tmp_path / "outside"
    outside.mkdir()
    folder = cache / f"models--{repo.replace('/', '--')}"
    target = folder / swapped if swapped else folder
    cut = len(model_bytes) // 3
    sha256 = swapping_hub.repos[repo].sha256[NAME]
    partial = folder / "blobs" / f"{sha256}.incomplete"
    midway = Midway(after=cut, then=lambda: _swap(target, outside, partial))
    swapping_hub.repos[repo].hostile.midway[NAME] = midway
    settings = make_settings(
        hf_cache_dir=cache,
        hf_offline=False,
        hf_endpoint=swapping_hub.url,
        hf_token=None,
        allow_pull=True,
    )
    with serving(settings) as (_, stub), pytest.raises(grpc.RpcError) as caught:
        list(stub.Pull(pb.PullRequest(model=repo)))
    assert midway.ran.is_set()
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "leads outside" in str(caught.value.details())
    assert str(target) in str(caught.value.details())
    assert list(outside.iterdir()) == []  # not the file, not a partial, not a folder
    # What arrived before the cut is in the folder that was moved, the cache's own.
    moved = target.with_name(target.name + ".moved")
    partials = list(moved.rglob("*.incomplete"))
    assert [p.stat().st_size for p in partials] == [cut]
