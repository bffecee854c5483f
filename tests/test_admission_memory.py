"""What Admit keeps and what it parses (issue 45): a remembered description holds the
few fields admission needs, not the parsed config.json, and a config or a listing of
more JSON containers than any real one has is refused before it is parsed. Against a
real server and the loopback hub (tests/fake_hub.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from service.admission import hub as remote_admission
from service.admission.describe import (
    CONFIG_ITEMS,
    MAX_JSON_BYTES,
    UnreadableModel,
    checkpoint_description,
    json_object,
)
from service.hub.budget import CONFIG_CONTAINERS, LISTING_BYTES, LISTING_CONTAINERS
from tests.conftest import make_settings, serving
from tests.fake_hub import FakeHub, FakeRepo, Hostile

MiB = 1 << 20
BASE = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "hidden_size": 64,
    "max_position_embeddings": 4096,
}
REPOS = 12
# A remembered description, whatever its config held: its kept fields' JSON at most.
KEPT_BYTES = 16 * 256 + 512
# What eleven near-cap Admits after a first may leave in the process (the test server
# runs in this one): kept whole, each config held some 40 MB.
REPOS_RSS_BOUND = 64 * MiB


def _near_cap(seed: int) -> bytes:
    """A config.json just under the 4 MiB cap and within every budget: nearly all of
    it as many strings as CONFIG_ITEMS allows (some 15 MB parsed, kept whole before)."""
    head = json.dumps({**BASE, "seed": seed})[:-1].encode() + b', "junk": ['
    count = CONFIG_ITEMS - 64
    item = b'"' + b"s" * ((MAX_JSON_BYTES - len(head) - 16) // count - 3) + b'",'
    return head + item * count + b'""]}'


def _bomb() -> bytes:
    head = json.dumps(BASE)[:-1].encode() + b', "junk": ['
    count = (MAX_JSON_BYTES - len(head) - 16) // 3
    return head + b"{}," * count + b"{}]}"


@pytest.fixture(scope="module")
def hub() -> Iterator[FakeHub]:
    repos = {
        f"acme/near-cap-{n}": FakeRepo(
            {"config.json": _near_cap(n), "model.safetensors": b"\0" * 8192}
        )
        for n in range(REPOS)
    }
    repos["acme/bomb"] = FakeRepo({"config.json": _bomb(), "model.safetensors": b"\0" * 8192})
    # A listing of empty objects just under its byte bound: a million dicts to parse.
    repos["acme/listing-bomb"] = FakeRepo(
        {"config.json": _near_cap(0), "model.safetensors": b"\0" * 8192},
        hostile=Hostile(listing_padding=LISTING_BYTES - 4096, listing_filler=b"{},"),
    )
    fake = FakeHub(repos=repos).start()
    yield fake
    fake.stop()


@pytest.fixture(scope="module")
def stub(hub: FakeHub, tmp_path_factory: pytest.TempPathFactory) -> Iterator[pb_grpc.InferenceStub]:
    settings = make_settings(
        hf_cache_dir=tmp_path_factory.mktemp("hub-cache"),
        hf_offline=False,
        hf_endpoint=hub.url,
        hf_token=None,
    )
    with serving(settings) as (_, stub):
        yield stub


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _kept_bytes() -> list[int]:
    with remote_admission._lock:
        found = list(remote_admission._remembered.values())
    return [len(json.dumps(entry.description.config)) for entry in found]


def test_remembered_descriptions_keep_only_what_admission_needs(
    stub: pb_grpc.InferenceStub,
) -> None:
    before = 0
    for n in range(REPOS):
        reply = stub.Admit(pb.AdmitRequest(model=f"acme/near-cap-{n}"), timeout=60)
        assert reply.architecture == "llama", reply.reason
        before = before or _rss()  # after the first: what one Admit ever costs, once
    growth = _rss() - before
    print(f"{REPOS - 1} near-cap Admits: RSS +{growth >> 20} MiB")  # docs/hub.md quotes it
    assert growth < REPOS_RSS_BOUND, growth
    kept = _kept_bytes()
    assert len(kept) >= REPOS
    assert max(kept) <= KEPT_BYTES, kept


def test_a_config_of_too_many_containers_is_refused_unparsed(
    stub: pb_grpc.InferenceStub,
) -> None:
    reply = stub.Admit(pb.AdmitRequest(model="acme/bomb"), timeout=60)
    assert not reply.admitted
    assert str(CONFIG_CONTAINERS) in reply.reason


def test_a_listing_of_too_many_containers_is_refused_unparsed(
    stub: pb_grpc.InferenceStub,
) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        stub.Admit(pb.AdmitRequest(model="acme/listing-bomb"), timeout=60)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert str(LISTING_CONTAINERS) in (refused.value.details() or "")


def test_the_kept_config_is_bounded_whatever_it_names() -> None:
    config = {**BASE, "architectures": ["A" * 10_000] * 10_000, "model_type": "m" * 10_000}
    description = checkpoint_description(config, 0)
    assert set(description.config) == {"model_type", "architectures"}
    assert len(json.dumps(description.config)) <= KEPT_BYTES


def test_the_container_bounds_leave_real_files_room() -> None:
    # Every file a listing names is two containers (it and its LFS pointer): the listing's
    # own bound of 38,000 files fits; a config of some thousand containers is described.
    assert LISTING_CONTAINERS >= 2 * 38_000
    config = {**BASE, "id2label": {str(n): f"label {n}" for n in range(20_000)}}
    assert json_object(json.dumps(config).encode(), "config.json", 1)["model_type"] == "llama"


def test_a_local_bomb_config_is_refused_by_name() -> None:
    with pytest.raises(UnreadableModel, match="objects and arrays"):
        json_object(_bomb(), "config.json", len(_bomb()))
