"""The loopback hub (tests/fake_hub.py) speaks what huggingface_hub asks: the ground
the hub-pull tests stand on, checked against the library itself."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from huggingface_hub import HfApi, HfFileSystem, hf_hub_download
from huggingface_hub.errors import GatedRepoError, RemoteEntryNotFoundError, RepositoryNotFoundError

from tests.fake_hub import LFS_FROM, FakeHub, FakeRepo, Midway

WEIGHTS = bytes(range(256)) * 64  # 16 KiB: served as an LFS file, through a redirect


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    fake = FakeHub(
        repos={
            "owner/model": FakeRepo({"config.json": b'{"model_type": "llama"}', "w.bin": WEIGHTS}),
            "owner/gated": FakeRepo({"config.json": b"{}"}, token="hf_secret"),
        }
    ).start()
    yield fake
    fake.stop()


def test_model_info_lists_files_with_sizes(hub: FakeHub) -> None:
    info = HfApi(endpoint=hub.url).model_info("owner/model", files_metadata=True)
    sizes = {sibling.rfilename: sibling.size for sibling in info.siblings or []}
    assert sizes == {"config.json": 23, "w.bin": len(WEIGHTS)}
    assert hub.bytes_sent("owner/model") == 0


def test_a_download_lands_in_the_cache_and_is_counted(hub: FakeHub, tmp_path: Path) -> None:
    assert len(WEIGHTS) >= LFS_FROM
    path = hf_hub_download("owner/model", "w.bin", endpoint=hub.url, cache_dir=tmp_path)
    assert Path(path).read_bytes() == WEIGHTS
    assert "/snapshots/" in path
    assert hub.bytes_sent("owner/model", "w.bin") == len(WEIGHTS)
    # A second call finds the cached file after one HEAD: no body bytes move.
    hf_hub_download("owner/model", "w.bin", endpoint=hub.url, cache_dir=tmp_path)
    assert hub.bytes_sent("owner/model", "w.bin") == len(WEIGHTS)


def test_a_ranged_read_moves_only_its_range(hub: FakeHub) -> None:
    filesystem = HfFileSystem(endpoint=hub.url, skip_instance_cache=True)
    with filesystem.open("owner/model/w.bin", "rb", block_size=1024) as remote:
        remote.seek(1000)
        assert remote.read(24) == WEIGHTS[1000:1024]
    # One 1 KiB block around the offset, not the 16 KiB file.
    assert 0 < hub.bytes_sent("owner/model", "w.bin") <= 2048


def test_errors_are_the_hubs(hub: FakeHub, tmp_path: Path) -> None:
    api = HfApi(endpoint=hub.url)
    with pytest.raises(RepositoryNotFoundError):
        api.model_info("owner/missing")
    with pytest.raises(GatedRepoError):
        api.model_info("owner/gated")
    assert HfApi(endpoint=hub.url, token="hf_secret").model_info("owner/gated").id == "owner/gated"
    with pytest.raises(RemoteEntryNotFoundError):
        hf_hub_download("owner/model", "nope.bin", endpoint=hub.url, cache_dir=tmp_path)


def test_midway_runs_its_function_after_the_bytes_then_cuts_the_body(hub: FakeHub) -> None:
    """The hook tests use to change the cache under a running pull (tests/test_hub_dirfd.py)."""
    seen: list[int] = []
    midway = Midway(after=1000, then=lambda: seen.append(hub.bytes_sent("owner/model", "w.bin")))
    hub.repos["owner/model"].hostile.midway["w.bin"] = midway
    sha256 = hub.repos["owner/model"].sha256["w.bin"]
    url = f"{hub.url}/lfs/owner/model/{sha256}"
    body = bytearray()

    def read() -> None:
        with httpx2.Client() as client, client.stream("GET", url) as response:
            for chunk in response.iter_bytes():
                body.extend(chunk)

    with pytest.raises(httpx2.RemoteProtocolError):  # fewer bytes than Content-Length
        read()
    assert midway.ran.is_set()
    assert seen == [1000]
    assert bytes(body) == WEIGHTS[:1000]
    assert "w.bin" not in hub.repos["owner/model"].hostile.midway  # once only
    with httpx2.Client() as client:
        assert client.get(url).content == WEIGHTS
