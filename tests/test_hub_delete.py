"""Deleting from the hub cache removes what was named, and nothing outside it (issue 45).

Before, `cache delete owner/name:FILE` deleted the whole repo and `owner/name@main:FILE`
the revision; a `refs/main` whose text was a path made `@main` remove that folder outside
the cache; and `blobs/` replaced by a link, with a snapshot link `../../blobs/victim`,
made `@COMMIT` delete the outside file. Here, on caches planted as the layout has them
(and as an attacker would leave them): `:FILE` removes that file of that revision (its
blob only if no other snapshot links to it), `@REV` that revision, a bare name the repo;
a ref that is not a commit id, and a link where a folder should be, are refused with
nothing removed; outside files stay.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from clients.cli import main
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from service.errors import AccessDenied, InvalidRequest, ModelNotFound, NotSupported
from service.hub.inventory import delete_cached, snapshot_folder
from service.model_source import HubReference
from tests.conftest import make_settings, serving

MAIN = "1" * 40
DEV = "2" * 40
SHARED = b"weights both revisions hold\n" * 100
SECRET = b"outside the cache: must survive\n"


def _plant(cache: Path, repo_id: str = "acme/x") -> Path:
    """Two revisions (main and dev) sharing one blob, each with files of its own:

    main: model.gguf (shared), README.md, sub/extra.json, tiny.Q4_K_M.gguf, tiny.Q8_0.gguf
    dev:  model.gguf (shared), README.md (its own)
    """
    folder = cache / f"models--{repo_id.replace('/', '--')}"
    blobs = {
        "shared": SHARED,
        "readme-main": b"# main\n",
        "readme-dev": b"# dev\n",
        "extra": b"{}",
        "q4": b"GGUF q4" * 300,
        "q8": b"GGUF q8" * 300,
    }
    (folder / "blobs").mkdir(parents=True)
    for name, data in blobs.items():
        (folder / "blobs" / name).write_bytes(data)
    files = {
        MAIN: {
            "model.gguf": "shared",
            "README.md": "readme-main",
            "sub/extra.json": "extra",
            "tiny.Q4_K_M.gguf": "q4",
            "tiny.Q8_0.gguf": "q8",
        },
        DEV: {"model.gguf": "shared", "README.md": "readme-dev"},
    }
    for commit, names in files.items():
        for name, blob in names.items():
            link = folder / "snapshots" / commit / name
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(folder / "blobs" / blob, link.parent))
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(MAIN)
    (folder / "refs" / "dev").write_text(DEV)
    return folder


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A planted cache's repo folder, the cache, and an outside folder with a victim."""
    cache = tmp_path / "cache"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_bytes(SECRET)
    (outside / "folder").mkdir()
    (outside / "folder" / "keep").write_bytes(SECRET)
    return _plant(cache), cache, outside


def _untouched(outside: Path) -> None:
    assert (outside / "victim").read_bytes() == SECRET
    assert (outside / "folder" / "keep").read_bytes() == SECRET


def _tree(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


# --- :FILE ---------------------------------------------------------------------------


def test_a_file_of_main_goes_alone_with_its_blob(layout: tuple[Path, Path, Path]) -> None:
    folder, cache, _ = layout
    before = _tree(folder)
    commits, freed = delete_cached(cache, HubReference("acme/x", None, "README.md"))
    assert commits == [MAIN]
    assert freed > 0
    assert before - _tree(folder) == {f"snapshots/{MAIN}/README.md", "blobs/readme-main"}
    assert (folder / "snapshots" / DEV / "README.md").read_bytes() == b"# dev\n"


def test_a_shared_file_leaves_its_blob_for_the_other_revision(
    layout: tuple[Path, Path, Path],
) -> None:
    folder, cache, _ = layout
    before = _tree(folder)
    commits, freed = delete_cached(cache, HubReference("acme/x", "main", "model.gguf"))
    assert (commits, freed) == ([MAIN], 0)  # a link went; the blob is dev's too
    assert before - _tree(folder) == {f"snapshots/{MAIN}/model.gguf"}
    assert (folder / "snapshots" / DEV / "model.gguf").read_bytes() == SHARED
    # Then dev's: the last link to it, so the blob goes too.
    delete_cached(cache, HubReference("acme/x", DEV, "model.gguf"))
    assert not (folder / "blobs" / "shared").exists()


def test_a_file_in_a_folder_goes_with_the_emptied_folder(layout: tuple[Path, Path, Path]) -> None:
    folder, cache, _ = layout
    delete_cached(cache, HubReference("acme/x", "main", "sub/extra.json"))
    assert not (folder / "snapshots" / MAIN / "sub").exists()
    assert (folder / "snapshots" / MAIN / "README.md").exists()


def test_a_quantization_tag_deletes_the_gguf_it_picks(layout: tuple[Path, Path, Path]) -> None:
    folder, cache, _ = layout
    before = _tree(folder)
    delete_cached(cache, HubReference("acme/x", None, "Q8_0"))
    assert before - _tree(folder) == {f"snapshots/{MAIN}/tiny.Q8_0.gguf", "blobs/q8"}


@pytest.mark.parametrize(
    ("hub", "error"),
    [
        (HubReference("acme/x", None, "missing.bin"), ModelNotFound),
        (HubReference("acme/x", None, "Q5_K"), ModelNotFound),  # a tag nothing matches
        (HubReference("acme/x", None, "tiny"), InvalidRequest),  # two GGUFs match
        (HubReference("acme/x", "nope", "README.md"), ModelNotFound),
        (HubReference("acme/x", None, "sub"), ModelNotFound),  # a folder, not a file
    ],
)
def test_a_file_that_is_not_there_is_refused_with_nothing_deleted(
    layout: tuple[Path, Path, Path], hub: HubReference, error: type[Exception]
) -> None:
    folder, cache, _ = layout
    before = _tree(folder)
    with pytest.raises(error):
        delete_cached(cache, hub)
    assert _tree(folder) == before


# --- @REV and the repo -------------------------------------------------------------------


def test_a_revision_goes_alone_keeping_what_the_other_shares(
    layout: tuple[Path, Path, Path],
) -> None:
    folder, cache, _ = layout
    readme_blocks = os.lstat(folder / "blobs" / "readme-dev").st_blocks * 512
    commits, freed = delete_cached(cache, HubReference("acme/x", "dev"))
    assert commits == [DEV]
    assert freed == readme_blocks  # dev's README blob, not the shared one
    assert not (folder / "snapshots" / DEV).exists()
    assert not (folder / "refs" / "dev").exists()
    assert not (folder / "blobs" / "readme-dev").exists()
    assert (folder / "snapshots" / MAIN / "model.gguf").read_bytes() == SHARED
    assert (folder / "refs" / "main").read_text() == MAIN


def test_a_revision_by_its_commit(layout: tuple[Path, Path, Path]) -> None:
    folder, cache, _ = layout
    assert delete_cached(cache, HubReference("acme/x", MAIN))[0] == [MAIN]
    assert not (folder / "refs" / "main").exists()  # the ref naming it went too
    assert (folder / "snapshots" / DEV / "model.gguf").read_bytes() == SHARED


def test_the_repo_goes_whole(layout: tuple[Path, Path, Path]) -> None:
    folder, cache, outside = layout
    (folder / "blobs" / "planted").symlink_to(outside / "victim")
    commits, freed = delete_cached(cache, HubReference("acme/x"))
    assert commits == [MAIN, DEV]
    assert freed > len(SHARED)
    assert not os.path.lexists(folder)
    _untouched(outside)


# --- what an attacker planted --------------------------------------------------------


@pytest.mark.parametrize("text", ["{outside}/folder", "../../../outside/folder", "main", ""])
@pytest.mark.parametrize("file", [None, "README.md"])
def test_a_ref_that_is_not_a_commit_is_refused_never_followed(
    layout: tuple[Path, Path, Path], text: str, file: str | None
) -> None:
    folder, cache, outside = layout
    (folder / "refs" / "main").write_text(text.format(outside=outside))
    before = _tree(folder)
    with pytest.raises(NotSupported) as refused:
        delete_cached(cache, HubReference("acme/x", "main", file))
    assert "not a commit id" in refused.value.message
    assert str(folder / "refs" / "main") in refused.value.message
    assert _tree(folder) == before
    _untouched(outside)
    with pytest.raises(NotSupported):  # the folder the pool would unload from: refused too
        snapshot_folder(cache, HubReference("acme/x", "main"))


def test_a_ref_that_is_a_link_is_refused(layout: tuple[Path, Path, Path]) -> None:
    folder, cache, outside = layout
    (folder / "refs" / "main").unlink()
    (outside / "ref").write_text(MAIN)
    (folder / "refs" / "main").symlink_to(outside / "ref")
    with pytest.raises(NotSupported, match="is a link"):
        delete_cached(cache, HubReference("acme/x", "main"))
    assert (folder / "snapshots" / MAIN).exists()


@pytest.mark.parametrize("file", [None, "README.md"])
def test_blobs_replaced_by_a_link_deletes_no_outside_file(
    layout: tuple[Path, Path, Path], file: str | None
) -> None:
    """blobs/ a link to the outside folder, and a snapshot link ../../blobs/victim."""
    folder, cache, outside = layout
    os.rename(folder / "blobs", folder / "blobs.old")
    (folder / "blobs").symlink_to(outside, target_is_directory=True)
    (folder / "snapshots" / MAIN / "README.md").unlink()
    (folder / "snapshots" / MAIN / "README.md").symlink_to("../../blobs/victim")
    before = _tree(folder)
    with pytest.raises(AccessDenied) as refused:
        delete_cached(cache, HubReference("acme/x", MAIN, file))
    assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED
    assert "leads outside" in refused.value.message
    assert _tree(folder) == before  # refused before anything went
    _untouched(outside)


@pytest.mark.parametrize("planted", ["snapshots", f"snapshots/{MAIN}"])
def test_a_snapshot_folder_replaced_by_a_link_is_not_entered(
    layout: tuple[Path, Path, Path], planted: str
) -> None:
    folder, cache, outside = layout
    link = folder / planted
    os.rename(link, link.with_name(link.name + ".old"))
    link.symlink_to(outside / "folder", target_is_directory=True)
    (outside / "folder" / "README.md").symlink_to(outside / "victim")
    if planted == "snapshots":
        with pytest.raises(AccessDenied):
            delete_cached(cache, HubReference("acme/x", "main", "README.md"))
    else:
        with pytest.raises(AccessDenied):  # the file is not looked for through the link
            delete_cached(cache, HubReference("acme/x", "main", "README.md"))
        commits, _ = delete_cached(cache, HubReference("acme/x", "main"))
        assert commits == [MAIN]
        assert not os.path.lexists(link)  # the link went, as a link
    _untouched(outside)
    assert (outside / "folder" / "README.md").is_symlink()


# --- through the server ----------------------------------------------------------------


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, pb_grpc.InferenceStub, Path]]:
    cache = tmp_path / "cache"
    folder = _plant(cache)
    settings = make_settings(hf_cache_dir=cache, hf_offline=True, allow_pull=True)
    with serving(settings) as (running, stub):
        yield running.target, stub, folder


def test_the_rpc_and_the_client_delete_what_they_name(
    server: tuple[str, pb_grpc.InferenceStub, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    target, stub, folder = server
    reply = stub.DeleteCached(pb.DeleteCachedRequest(model="acme/x@main:README.md"))
    assert list(reply.commits) == [MAIN]
    assert not (folder / "snapshots" / MAIN / "README.md").exists()
    assert (folder / "snapshots" / MAIN / "model.gguf").exists()
    assert main(["--target", target, "cache", "delete", "acme/x:tiny.Q8_0.gguf"]) == 0
    assert "deleted acme/x:tiny.Q8_0.gguf" in capsys.readouterr().out
    assert not (folder / "snapshots" / MAIN / "tiny.Q8_0.gguf").exists()
    assert (folder / "snapshots" / MAIN / "tiny.Q4_K_M.gguf").exists()
    with pytest.raises(grpc.RpcError) as caught:
        stub.DeleteCached(pb.DeleteCachedRequest(model="acme/x:missing.bin"))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert "nothing was deleted" in str(caught.value.details())
    reply = stub.DeleteCached(pb.DeleteCachedRequest(model="acme/x@dev"))
    assert list(reply.commits) == [DEV]
    assert (folder / "snapshots" / MAIN).is_dir()
    # A ref holding a path: refused, the folder it names untouched.
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_bytes(SECRET)
    (folder / "refs" / "main").write_text(str(outside))
    with pytest.raises(grpc.RpcError) as caught:
        stub.DeleteCached(pb.DeleteCachedRequest(model="acme/x@main"))
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "not a commit id" in str(caught.value.details())
    assert (outside / "keep").read_bytes() == SECRET
    assert (folder / "snapshots" / MAIN).is_dir()
