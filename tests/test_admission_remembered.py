"""What Admit keeps, and what a near-cap config or listing costs the server (issue 45).

The seam tests hold the remembered set to its stated bound (REMEMBERED entries of at
most REMEMBERED_ENTRY_BYTES) and every string of a description to its cap. The
process test runs the server in a child (tests/server_process.py) against the
loopback hub and reads its VmRSS and VmHWM (reset before each round): twenty Admits of
distinct configs just under the 4 MiB cap, then eight at once of repos whose listing
is near its 8 MiB cap. The figures are printed; docs/hub.md quotes them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from service.admission import hub as remote_admission
from service.admission.describe import (
    CONFIG_ITEMS,
    DEFECT_CHARACTERS,
    MAX_JSON_BYTES,
    NAME_CHARACTERS,
    UnreadableModel,
    checkpoint_description,
    json_counts,
    json_object,
    pipeline_description,
)
from service.admission.hub import (
    REMEMBERED,
    REMEMBERED_BYTES,
    REMEMBERED_ENTRY_BYTES,
    Remembered,
    footprint,
    remember,
    remembered_bytes,
)
from service.admission.quantization import METHOD_CHARACTERS
from service.hub.budget import CONFIG_CONTAINERS, LISTING_BYTES, LISTING_ITEMS
from tests.fake_hub import FakeHub, FakeRepo, Hostile
from tests.server_process import server_process, wait_until_serving

MiB = 1 << 20
BASE = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "hidden_size": 64,
    "max_position_embeddings": 4096,
}
CONFIGS = 20
LISTINGS = 8
# What twenty near-cap Admits may leave in the server once they are answered, after a
# first has warmed the code paths: the remembered set's bound and the allocator's slack.
CONFIGS_RSS_BOUND = 48 * MiB
# What eight Admits at once of repos with near-cap listings may add to the server's
# peak: two read at a time (service.hub.budget), each holding its body and its parse.
LISTINGS_PEAK_BOUND = 256 * MiB


def _near_cap_config(seed: int) -> bytes:
    """A config.json just under the 4 MiB cap, within every budget: as many strings as
    CONFIG_ITEMS allows, the rest of the bytes in them (some 15 MB parsed)."""
    head = json.dumps({**BASE, "seed": seed})[:-1].encode() + b', "junk": ['
    count = CONFIG_ITEMS - 64
    item = b'"' + b"s" * ((MAX_JSON_BYTES - len(head) - 16) // count - 3) + b'",'
    return head + item * count + b'""]}'


def _item_bomb() -> bytes:
    """4 MiB of two-letter strings: no container, 800,000 items, 73 MB parsed."""
    head = json.dumps(BASE)[:-1].encode() + b', "junk": ['
    return head + b'"ab",' * ((MAX_JSON_BYTES - len(head) - 16) // 5) + b'"ab"]}'


def _checkpoint(config: bytes, hostile: Hostile | None = None) -> FakeRepo:
    files = {"config.json": config, "model.safetensors": b"\0" * 8192}
    return FakeRepo(files, hostile=hostile or Hostile())


# A listing's sibling as the hub writes one with ?blobs=true: 7 items, 2 containers.
_SIBLING = json.dumps(
    {
        "rfilename": "model-00001-of-00002.safetensors",
        "blobId": "0" * 40,
        "size": 4_000_000_000,
        "lfs": {"sha256": "0" * 64, "size": 4_000_000_000, "pointerSize": 135},
    }
).encode()


@pytest.fixture(scope="module")
def hub() -> Iterator[FakeHub]:
    repos = {f"acme/near-cap-{n}": _checkpoint(_near_cap_config(n)) for n in range(CONFIGS + 1)}
    repos["acme/item-bomb"] = _checkpoint(_item_bomb())
    padding = LISTING_BYTES - 4096  # the rest of the listing: the repo's own files
    config = json.dumps(BASE).encode()
    for n in range(LISTINGS):
        # Files the listing names in a field nobody reads, as a hub naming 38,000 would.
        filler = Hostile(listing_padding=padding, listing_filler=_SIBLING + b",")
        repos[f"acme/long-listing-{n}"] = _checkpoint(config, filler)
        strings = Hostile(listing_padding=padding, listing_filler=b'"ab",')
        repos[f"acme/string-listing-{n}"] = _checkpoint(config, strings)
    fake = FakeHub(repos=repos).start()
    yield fake
    fake.stop()


@pytest.fixture(scope="module")
def server(hub: FakeHub, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, str]]:
    cache = tmp_path_factory.mktemp("cache")
    arguments = ["--hf-endpoint", hub.url, "--no-hf-offline", "--hf-cache-dir", str(cache)]
    with server_process(arguments, env={"HF_TOKEN": ""}) as process:
        address = process.wait_for_address()
        with grpc.insecure_channel(address) as channel:
            wait_until_serving(channel)
        yield process.process.pid, address


def _memory(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of /proc/PID/status, in bytes."""
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0]) * 1024
    return found


def _admit(stub: pb_grpc.InferenceStub, model: str) -> pb.AdmitResponse:
    reply: pb.AdmitResponse = stub.Admit(pb.AdmitRequest(model=model), timeout=120)
    return reply


def _admit_or_status(stub: pb_grpc.InferenceStub, model: str) -> pb.AdmitResponse | grpc.RpcError:
    try:
        return _admit(stub, model)
    except grpc.RpcError as exc:
        return exc


def test_twenty_near_cap_configs_leave_the_server_within_its_bound(
    server: tuple[int, str],
) -> None:
    pid, address = server
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.InferenceStub(channel)
        assert _admit(stub, f"acme/near-cap-{CONFIGS}").architecture == "llama"  # warm
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
        before = _memory(pid)["VmRSS"]
        for n in range(CONFIGS):
            reply = _admit(stub, f"acme/near-cap-{n}")
            assert reply.architecture == "llama", reply.reason
        after = _memory(pid)
        bomb = _admit(stub, "acme/item-bomb")
    growth, peak = after["VmRSS"] - before, after["VmHWM"] - before
    print(f"{CONFIGS} near-cap configs: RSS +{growth / MiB:.1f} MiB, peak +{peak / MiB:.1f} MiB")
    assert growth < CONFIGS_RSS_BOUND, growth
    assert not bomb.admitted
    assert f"more than {CONFIG_ITEMS} JSON values" in bomb.reason


@pytest.mark.parametrize("shape", ["long", "string"])
def test_eight_near_cap_listings_at_once_stay_within_the_peak_bound(
    server: tuple[int, str], shape: str
) -> None:
    pid, address = server
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.InferenceStub(channel)
        assert _admit(stub, f"acme/near-cap-{CONFIGS}").architecture == "llama"
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        before = _memory(pid)["VmRSS"]
        models = [f"acme/{shape}-listing-{n}" for n in range(LISTINGS)]
        with ThreadPoolExecutor(LISTINGS) as pool:
            replies = list(pool.map(lambda model: _admit_or_status(stub, model), models))
        after = _memory(pid)
    peak, growth = after["VmHWM"] - before, after["VmRSS"] - before
    shown = f"peak +{peak / MiB:.1f} MiB, after +{growth / MiB:.1f} MiB"
    print(f"{LISTINGS} near-cap {shape} listings at once: {shown}")
    if shape == "long":  # 38,000 files' worth: within every budget, described
        assert all(getattr(reply, "architecture", "") == "llama" for reply in replies), replies
    else:  # 1.6 million values: refused before they are parsed
        for reply in replies:
            assert isinstance(reply, grpc.RpcError), reply
            assert reply.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert f"more than {LISTING_ITEMS} JSON values" in (reply.details() or "")
    assert peak < LISTINGS_PEAK_BOUND, peak


# --- the remembered set, at its seam ------------------------------------------------------


def _entry(files: int, name: str = "llama") -> Remembered:
    config = {**BASE, "model_type": name}
    description = checkpoint_description(config, 1 << 30)
    shards = tuple((f"model-{n:05d}-of-{files:05d}.safetensors", 1 << 30) for n in range(files))
    return Remembered("checkpoint", description, shards)


@pytest.fixture
def empty_remembered() -> Iterator[None]:
    with remote_admission._lock:
        saved = remote_admission._remembered.copy()
        remote_admission._remembered.clear()
    yield
    with remote_admission._lock:
        remote_admission._remembered.clear()
        remote_admission._remembered.update(saved)


def test_the_remembered_set_holds_its_stated_bound(empty_remembered: None) -> None:
    for n in range(REMEMBERED + 16):
        key = (f"https://hub.example/{'e' * 200}", f"acme/{'r' * 90}-{n}", "c" * 40, None)
        assert remember(key, _entry(400, "m" * 10_000))  # a 400-shard checkpoint fits
    assert len(remote_admission._remembered) == REMEMBERED
    assert remembered_bytes() <= REMEMBERED_BYTES == REMEMBERED * REMEMBERED_ENTRY_BYTES


def test_an_entry_past_its_bound_is_read_again_not_kept(empty_remembered: None) -> None:
    entry = _entry(5_000)
    assert footprint(entry) > REMEMBERED_ENTRY_BYTES
    assert not remember(("e", "acme/huge", "c" * 40, None), entry)
    assert remembered_bytes() == 0


def test_every_string_of_a_description_is_bounded() -> None:
    huge = "x" * (1 << 20)
    config = {
        **BASE,
        "model_type": huge,
        "architectures": [huge] * 1_000,
        "quantization_config": {"quant_method": huge},
    }
    description = checkpoint_description(config, 0)
    assert len(description.architecture) <= NAME_CHARACTERS
    assert len(description.quantization.method) <= METHOD_CHARACTERS
    assert len(description.defect) <= DEFECT_CHARACTERS
    assert description.defect  # a model_type no module could have
    pipeline = pipeline_description({"_class_name": huge}, 0, "float16")
    assert len(pipeline.architecture) <= NAME_CHARACTERS
    assert "characters long" in pipeline.defect
    for kept in (description, pipeline):
        assert footprint(kept) < 8 << 10


# --- the JSON counts ---------------------------------------------------------------------


def test_brackets_and_commas_in_strings_are_not_counted_once_past_a_budget() -> None:
    text = json.dumps({"a": "{[," * 100_000, "b": [1, 2, {}]}).encode()
    # An empty container counts as one item: an upper bound, by one a container at most.
    assert json_counts(text, 10, 10) == (3, 6)
    assert json_counts(text, 1 << 20, 1 << 20)[0] > 100_000  # within both: the rough bound


def test_a_config_of_too_many_items_is_refused_unparsed() -> None:
    with pytest.raises(UnreadableModel, match=f"more than {CONFIG_ITEMS} JSON values"):
        json_object(_item_bomb(), "config.json", len(_item_bomb()))
    raw = b"[" + b"{}," * (CONFIG_CONTAINERS + 1) + b"{}]"
    with pytest.raises(UnreadableModel, match=f"more than {CONFIG_CONTAINERS} JSON objects"):
        json_object(raw, "config.json", len(raw))


def test_a_config_of_many_bracketed_strings_is_parsed() -> None:
    config = {**BASE, "notes": ["[{" * 40] * 40_000}  # 3.3 MB, 3.2 M brackets
    raw = json.dumps(config).encode()
    assert json_object(raw, "config.json", len(raw))["model_type"] == "llama"
