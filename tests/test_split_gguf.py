"""Split GGUF files (NAME-00001-of-0000N.gguf): admitted and served as the one model they are.

llama.cpp loads a split GGUF from its first part and opens the others beside it,
so admission reads every part's header: the key-values of the first, the tensors
of all. The splits here are SmolLM2 cut by tests/split_gguf.py (as llama.cpp's
gguf-split cuts), on disk under a --models-dir and in a repo of tests/fake_hub.py.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gguf
import grpc
import llama_cpp
import pytest

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from service.admission import describe
from service.admission.gguf_header import read_gguf_header
from service.hub.ranged import BLOCK, RUN_BLOCKS
from service.models.embedded import EMBEDDED_MODELS
from tests.conftest import SMOLLM, collect, finished_of, make_settings, serving, text_of
from tests.fake_hub import FakeHub, FakeRepo
from tests.split_gguf import SPLIT_COUNT, SPLIT_NO, set_split_key, split_name, write_split_gguf

SMOLLM_FILE = EMBEDDED_MODELS[SMOLLM].locate()
PREFIX = SMOLLM_FILE.stem


def first_part(folder: str, parts: int) -> str:
    """A model reference to a split's first part, under the models dir."""
    return f"{folder}/{split_name(PREFIX, 1, parts)}"


# Three-part splits broken one way each: the part changed (from 1), the change, and
# what the refusal says.
BROKEN: dict[str, tuple[int, Callable[[Path], None], str]] = {
    "missing": (
        3,
        Path.unlink,
        f"'{split_name(PREFIX, 3, 3)}' (part 3 of 3 of a split GGUF) cannot be read: No such file",
    ),
    "count-lies": (
        1,
        lambda part: set_split_key(part, SPLIT_COUNT, 2),
        "is named part 1 of 3 of a split GGUF, but has split.count 2",
    ),
    "wrong-no": (
        2,
        lambda part: set_split_key(part, SPLIT_NO, 2),
        "part 2 of 3 of a split GGUF, has split.no 2; llama.cpp wants 1 there",
    ),
    # Each part's layout is checked against its own header and size.
    "truncated": (
        2,
        lambda part: os.truncate(part, part.stat().st_size - 4096),
        f"'{split_name(PREFIX, 2, 3)}' (part 2): the data of tensor",
    ),
    # llama.cpp asserts a later part's split.no is a UINT16: SIGABRT, not an error.
    "no-type": (
        2,
        lambda part: set_split_key(part, SPLIT_NO, 1, gguf.GGUFValueType.INT16),
        f"split.no in '{split_name(PREFIX, 2, 3)}' is stored as INT16; llama.cpp reads it only",
    ),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A models dir: SmolLM2 in 2 parts (two/) and in 3 (three/), and the broken splits,
    each three/ linked, but for a copy of the part it changes (changed in place)."""
    root = tmp_path_factory.mktemp("models")
    for folder, parts in (("two", 2), ("three", 3)):
        (root / folder).mkdir()
        write_split_gguf(SMOLLM_FILE, root / folder, parts)
    for folder, (changed, change, _) in BROKEN.items():
        (root / folder).mkdir()
        for part in (1, 2, 3):
            name = split_name(PREFIX, part, 3)
            place = shutil.copyfile if part == changed else os.link
            place(root / "three" / name, root / folder / name)
        change(root / folder / split_name(PREFIX, changed, 3))
    return root


@pytest.fixture(scope="module")
def hub(models: Path) -> Iterator[FakeHub]:
    def repo(folder: str) -> FakeRepo:
        return FakeRepo({path.name: path for path in (models / folder).iterdir()})

    fake = FakeHub(repos={"acme/smol-split": repo("three"), "acme/split-lies": repo("count-lies")})
    yield fake.start()
    fake.stop()


@pytest.fixture(scope="module")
def stub(
    models: Path, hub: FakeHub, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[pb_grpc.InferenceStub]:
    settings = make_settings(
        models_dir=[models],
        hf_cache_dir=tmp_path_factory.mktemp("hub-cache"),
        hf_offline=False,
        hf_endpoint=hub.url,
        hf_token=None,
    )
    with serving(settings) as (_, stub):
        yield stub


def admit(stub: pb_grpc.InferenceStub, model: str) -> pb.AdmitResponse:
    reply: pb.AdmitResponse = stub.Admit(
        pb.AdmitRequest(model=model, capability=pb.CAPABILITY_TEXT)
    )
    return reply


def generate(stub: pb_grpc.InferenceStub, model: str) -> list[pb.GenerateResponse]:
    request = pb.GenerateRequest(model=model, prompt="Hello", max_tokens=4, temperature=0)
    return collect(stub.Generate(request))


# --- the helper, against llama.cpp's own loader --------------------------------------------


def test_llama_cpp_loads_the_parts_as_the_whole_file(models: Path) -> None:
    """tests/split_gguf.py writes what llama.cpp loads: the same greedy tokens."""

    def greedy(path: Path) -> str:
        model = llama_cpp.Llama(model_path=str(path), n_ctx=256, n_threads=1, verbose=False)
        try:
            completion: Any = model("Hello", max_tokens=4, temperature=0)
        finally:
            model.close()
        return str(completion["choices"][0]["text"])

    whole = greedy(SMOLLM_FILE)
    assert whole
    assert greedy(models / first_part("three", 3)) == whole
    header = read_gguf_header(models / "three" / split_name(PREFIX, 3, 3))
    assert set(header.values) == {SPLIT_NO, SPLIT_COUNT, "split.tensors.count"}
    assert header.values[SPLIT_NO] == 2


# --- local files ----------------------------------------------------------------------------


@pytest.mark.parametrize(("folder", "parts"), [("two", 2), ("three", 3)])
def test_a_split_is_admitted_as_the_whole_file_is(
    stub: pb_grpc.InferenceStub, models: Path, folder: str, parts: int
) -> None:
    whole, split = admit(stub, SMOLLM), admit(stub, first_part(folder, parts))
    assert split.admitted, split.reason
    assert (split.backend, split.architecture) == (whole.backend, whole.architecture)
    assert split.quantization == whole.quantization
    assert split.memory.kv_cache_bytes == whole.memory.kv_cache_bytes
    sizes = [path.stat().st_size for path in (models / folder).iterdir()]
    assert len(sizes) == parts
    assert split.memory.weights_bytes == sum(sizes)


def test_generate_on_a_split_returns_the_whole_files_tokens(
    stub: pb_grpc.InferenceStub,
) -> None:
    split = generate(stub, first_part("three", 3))
    assert finished_of(split).usage.completion_tokens == 4
    assert text_of(split) == text_of(generate(stub, SMOLLM))


@pytest.mark.parametrize("folder", list(BROKEN))
def test_a_broken_split_is_refused_with_what_is_wrong(
    stub: pb_grpc.InferenceStub, folder: str
) -> None:
    expected = BROKEN[folder][2]
    reply = admit(stub, first_part(folder, 3))
    assert not reply.admitted
    assert expected in reply.reason
    with pytest.raises(grpc.RpcError) as caught:
        generate(stub, first_part(folder, 3))
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert expected in (caught.value.details() or "")


def test_the_server_serves_on_after_broken_splits(stub: pb_grpc.InferenceStub) -> None:
    for folder in BROKEN:
        assert not admit(stub, first_part(folder, 3)).admitted
    assert finished_of(generate(stub, first_part("two", 2))).usage.completion_tokens == 4


def test_a_later_part_named_alone_is_refused(stub: pb_grpc.InferenceStub) -> None:
    """llama.cpp loads a split from its first part, and refuses a later one."""
    reply = admit(stub, f"three/{split_name(PREFIX, 2, 3)}")
    assert not reply.admitted
    assert f"llama.cpp loads one from its first part, '{split_name(PREFIX, 1, 3)}'" in reply.reason


@pytest.mark.slow  # its `models` writes SmolLM2 in parts, and broken copies
def test_a_split_is_described_again_when_any_part_changes(models: Path) -> None:
    """The cache is keyed by every part's size and modification time, not the first's."""
    first = models / first_part("two", 2)
    describe.describe_gguf(first)
    hits = describe._describe_gguf_cached.cache_info().hits
    describe.describe_gguf(first)
    assert describe._describe_gguf_cached.cache_info().hits == hits + 1
    second = models / "two" / split_name(PREFIX, 2, 2)
    status = second.stat()
    os.utime(second, ns=(status.st_atime_ns, status.st_mtime_ns + 1_000_000))
    misses = describe._describe_gguf_cached.cache_info().misses
    assert not describe.describe_gguf(first).defect
    assert describe._describe_gguf_cached.cache_info().misses == misses + 1


# --- a hub repo, read by ranges -------------------------------------------------------------


def test_a_hub_split_is_admitted_from_each_parts_header(
    stub: pb_grpc.InferenceStub, hub: FakeHub, models: Path
) -> None:
    reply = admit(stub, "acme/smol-split")
    assert reply.admitted, reply.reason
    local = admit(stub, first_part("three", 3))
    assert (reply.architecture, reply.quantization) == (local.architecture, local.quantization)
    assert reply.memory.weights_bytes == local.memory.weights_bytes
    names = [split_name(PREFIX, part, 3) for part in (1, 2, 3)]
    assert [f.path for f in reply.download.files] == names
    for name in names:
        path = models / "three" / name
        header_end = read_gguf_header(path).data_start
        sent = hub.bytes_sent("acme/smol-split", name)
        assert 0 < sent <= header_end + RUN_BLOCKS * BLOCK, name
        assert sent < path.stat().st_size / 10, name


def test_a_hub_split_that_lies_costs_one_header(stub: pb_grpc.InferenceStub, hub: FakeHub) -> None:
    """The first part's split.count is checked before any other part is read."""
    reply = admit(stub, "acme/split-lies")
    assert not reply.admitted
    assert BROKEN["count-lies"][2] in reply.reason
    assert hub.bytes_sent("acme/split-lies", split_name(PREFIX, 1, 3)) > 0
    for part in (2, 3):
        assert hub.bytes_sent("acme/split-lies", split_name(PREFIX, part, 3)) == 0
