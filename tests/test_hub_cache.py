"""The hub cache as a user manages it: revisions, listing, deleting, dry runs, split GGUFs.

One server with --allow-pull pulls from a loopback hub (tests/fake_hub.py)
into a cache of its own; the Python client's commands run against it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from clients.cli import main
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from service.models.embedded import EMBEDDED_MODELS
from tests.conftest import SMOLLM, collect, finished_of, make_settings, serving
from tests.fake_hub import FakeHub, FakeRepo
from tests.split_gguf import write_split_gguf

SMOLLM_FILE = EMBEDDED_MODELS[SMOLLM].locate()
SIZE = SMOLLM_FILE.stat().st_size
NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
OTHER_QUANT = "SmolLM2-135M-Instruct.Q8_0.gguf"


def _version(tag: bytes) -> FakeRepo:
    """The same weights at another commit (its VERSION file differs)."""
    return FakeRepo({NAME: SMOLLM_FILE, "VERSION": tag})


@pytest.fixture(scope="module")
def split_parts(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return write_split_gguf(SMOLLM_FILE, tmp_path_factory.mktemp("split"), 2)


@pytest.fixture(scope="module")
def hub(split_parts: list[Path]) -> Iterator[FakeHub]:
    revisions = _version(b"main")
    revisions.revisions = {"dev": _version(b"dev"), "v1.0": _version(b"v1.0")}
    fake = FakeHub(
        repos={
            "acme/revs": revisions,
            "acme/multi": FakeRepo({NAME: SMOLLM_FILE, OTHER_QUANT: b"GGUF" + b"\0" * 4096}),
            "acme/split": FakeRepo({part.name: part for part in split_parts}),
            "acme/later": FakeRepo({NAME: SMOLLM_FILE}),
        }
    ).start()
    yield fake
    fake.stop()


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hub-cache")


@pytest.fixture(scope="module")
def server(hub: FakeHub, cache: Path) -> Iterator[tuple[str, pb_grpc.InferenceStub]]:
    settings = make_settings(
        hf_cache_dir=cache, hf_offline=False, hf_endpoint=hub.url, hf_token=None, allow_pull=True
    )
    with serving(settings) as (running, stub):
        yield running.target, stub


def _pull(stub: pb_grpc.InferenceStub, model: str) -> pb.PullFinished:
    events: list[pb.PullResponse] = list(stub.Pull(pb.PullRequest(model=model)))
    return events[-1].finished


def _generates(stub: pb_grpc.InferenceStub, model: str) -> None:
    reply = collect(stub.Generate(pb.GenerateRequest(model=model, prompt="Hi", max_tokens=2)))
    assert finished_of(reply).usage.completion_tokens == 2


def test_a_branch_a_tag_and_a_commit_each_pull_their_own_snapshot(
    server: tuple[str, pb_grpc.InferenceStub], hub: FakeHub, cache: Path
) -> None:
    _, stub = server
    repo = hub.repos["acme/revs"]
    commits = {"dev": repo.revisions["dev"].commit, "v1.0": repo.revisions["v1.0"].commit}
    assert len({repo.commit, *commits.values()}) == 3
    first = _pull(stub, "acme/revs@dev")
    assert first.bytes_transferred == SIZE
    # The same weights at other commits: linked to the blob already there.
    assert _pull(stub, "acme/revs@v1.0").bytes_transferred == 0
    assert _pull(stub, f"acme/revs@{repo.commit}").bytes_transferred == 0
    folder = cache / "models--acme--revs"
    assert (folder / "refs" / "dev").read_text() == commits["dev"]
    assert (folder / "refs" / "v1.0").read_text() == commits["v1.0"]
    assert not (folder / "refs" / "main").exists()  # main was named by its commit
    for commit in [repo.commit, *commits.values()]:
        assert (folder / "snapshots" / commit / NAME).resolve().parent == folder / "blobs"
    _generates(stub, "acme/revs@v1.0")
    _generates(stub, f"acme/revs@{repo.commit}")
    # A revision the cache does not hold is not on disk, whatever else is.
    assert not stub.Admit(pb.AdmitRequest(model="acme/revs")).available_locally


def test_the_cache_is_listed_and_revisions_deleted(
    server: tuple[str, pb_grpc.InferenceStub],
    hub: FakeHub,
    cache: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    target, stub = server
    _pull(stub, "acme/revs@dev")
    _pull(stub, "acme/revs@v1.0")
    listed = {repo.repo: repo for repo in stub.ListCached(pb.ListCachedRequest()).repos}
    revs = listed["acme/revs"]
    refs = {tuple(revision.refs) for revision in revs.revisions}
    assert {("dev",), ("v1.0",)} <= refs
    files = {file.path: file.size_bytes for rev in revs.revisions for file in rev.files}
    assert files == {NAME: SIZE}
    assert SIZE <= revs.size_bytes < 2 * SIZE  # one blob, however many snapshots
    assert revs.last_used_unix_ms > 0
    assert main(["--target", target, "cache", "list"]) == 0
    out = capsys.readouterr().out
    assert "acme/revs" in out
    assert "(dev)" in out
    assert NAME in out
    # One revision: its snapshot and ref go, the blob stays for the others.
    dev = hub.repos["acme/revs"].revisions["dev"].commit
    deleted = stub.DeleteCached(pb.DeleteCachedRequest(model="acme/revs@dev"))
    assert list(deleted.commits) == [dev]
    folder = cache / "models--acme--revs"
    assert not (folder / "refs" / "dev").exists()
    assert not (folder / "snapshots" / dev).exists()
    _generates(stub, "acme/revs@v1.0")
    # The whole repo, through the client.
    assert main(["--target", target, "cache", "delete", "acme/revs"]) == 0
    assert "freed" in capsys.readouterr().out
    assert not folder.exists()
    assert not stub.Admit(pb.AdmitRequest(model="acme/revs@v1.0")).available_locally
    with pytest.raises(grpc.RpcError) as caught:
        stub.DeleteCached(pb.DeleteCachedRequest(model="acme/revs"))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def test_deleting_needs_allow_pull(hub: FakeHub, tmp_path: Path) -> None:
    settings = make_settings(hf_cache_dir=tmp_path, hf_endpoint=hub.url, allow_pull=False)
    with serving(settings) as (_, stub), pytest.raises(grpc.RpcError) as caught:
        stub.DeleteCached(pb.DeleteCachedRequest(model="acme/revs"))
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "--allow-pull" in str(caught.value.details())


def test_a_dry_run_lists_the_quantizations_and_fetches_no_weights(
    server: tuple[str, pb_grpc.InferenceStub], hub: FakeHub, capsys: pytest.CaptureFixture[str]
) -> None:
    target, _ = server
    code = main(["--target", target, "pull", "--dry-run", "acme/multi:Q4_1"])
    out = capsys.readouterr().out
    assert code == 0
    assert f"* {SIZE / 1024**2:.1f} MiB  {NAME}" in out.replace("  *", "*").replace("   ", " ")
    assert OTHER_QUANT in out
    assert "admitted:" in out
    # The header of the chosen file, by ranges: a fraction of it.
    assert hub.bytes_sent("acme/multi", NAME) < SIZE / 10
    assert hub.bytes_sent("acme/multi", OTHER_QUANT) == 0


def test_the_hint_for_a_model_not_downloaded_names_its_file(
    server: tuple[str, pb_grpc.InferenceStub],
) -> None:
    _, stub = server
    request = pb.GenerateRequest(model="acme/later:Q4_1", prompt="Hi", max_tokens=1)
    with pytest.raises(grpc.RpcError) as caught:
        list(stub.Generate(request))
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    details = str(caught.value.details())
    assert "inference-client pull acme/later:Q4_1" in details
    assert 'hf download acme/later --include "*Q4_1*.gguf"' in details


def test_a_split_gguf_is_pulled_whole_and_served(
    server: tuple[str, pb_grpc.InferenceStub], split_parts: list[Path], cache: Path
) -> None:
    _, stub = server
    admit = stub.Admit(pb.AdmitRequest(model="acme/split"))
    assert admit.admitted, admit.reason
    assert [f.path for f in admit.download.files] == [part.name for part in split_parts]
    finished = _pull(stub, "acme/split")
    assert finished.admit.admitted, finished.admit.reason
    assert finished.bytes_transferred == sum(part.stat().st_size for part in split_parts)
    snapshot = next((cache / "models--acme--split" / "snapshots").iterdir())
    for part in split_parts:
        assert (snapshot / part.name).read_bytes() == part.read_bytes()
    _generates(stub, "acme/split")
