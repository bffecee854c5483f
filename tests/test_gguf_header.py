"""The GGUF header reader: what real files hold, and bounded cost whatever a file claims."""

from __future__ import annotations

import random
import re
import tracemalloc
from pathlib import Path

import pytest

from service.admission import gguf_header
from service.admission.gguf_header import (
    STRING,
    GGUFArray,
    GGUFFormatError,
    Skipped,
    read_gguf_header,
)
from service.models.embedded import EMBEDDED_MODELS
from tests import gguf_mutations as gm
from tests.conftest import GEMMA, SMOLLM


@pytest.fixture(scope="module")
def template() -> gm.Template:
    return gm.Template.parse(EMBEDDED_MODELS[SMOLLM].locate())


def bytes_read() -> int:
    """Bytes this process has read through system calls so far (Linux)."""
    text = Path("/proc/self/io").read_text()
    match = re.search(r"^rchar: (\d+)$", text, re.MULTILINE)
    assert match is not None
    return int(match.group(1))


def refusal(path: Path) -> str:
    with pytest.raises(GGUFFormatError) as caught:
        read_gguf_header(path)
    return str(caught.value)


# --- real files --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "blocks", "tokens", "tensors", "data_start"),
    [(SMOLLM, 30, 49_152, 272, 1_785_664), (GEMMA, 18, 262_144, 236, 6_525_120)],
)
def test_the_embedded_models_headers_are_read(
    model: str, blocks: int, tokens: int, tensors: int, data_start: int
) -> None:
    path = EMBEDDED_MODELS[model].locate()
    header = read_gguf_header(path)
    arch = header.values["general.architecture"]
    assert header.values[f"{arch}.block_count"] == blocks
    # The vocabulary is walked past, not decoded: its size is kept, its strings are not.
    assert header.values["tokenizer.ggml.tokens"] == Skipped(STRING, tokens)
    assert len(header.tensors) == tensors
    assert header.data_start == data_start  # as the gguf package finds it
    assert header.file_size == path.stat().st_size


def test_long_strings_and_arrays_are_skipped_and_short_ones_kept(
    template: gm.Template, tmp_path: Path
) -> None:
    edited = template.clone()
    edited.put_string("tokenizer.chat_template", "x" * 5_000)
    edited.put_array("general.long", gm.U32, list(range(5_000)))
    edited.put_array("general.short", gm.U32, [1, 2, 3])
    header = read_gguf_header(gm.write(edited.encode(), tmp_path / "m.gguf"))
    assert header.values["tokenizer.chat_template"] == Skipped(STRING, 5_000)
    assert header.values["general.long"] == Skipped(gm.U32, 5_000)
    assert header.values["general.short"] == GGUFArray(gm.U32, (1, 2, 3))


# --- what a file claims is checked before anything is read --------------------------------


def test_a_huge_tensor_count_in_a_sparse_file_is_refused_without_reading_it(
    template: gm.Template, tmp_path: Path
) -> None:
    """Issue 15, item 6: 2^40 tensors claimed in a 120 MB sparse file."""
    path = gm.write(gm.huge_tensor_count_sparse().image(template), tmp_path / "claims.gguf")
    assert path.stat().st_size == 120 << 20
    before = bytes_read()
    reason = refusal(path)
    assert "claims 1099511627776 tensors" in reason
    assert f"the cap is {gguf_header.MAX_TENSORS}" in reason
    assert bytes_read() - before < 4 << 20  # one buffer's worth, not the 120 MB


def test_tensor_infos_up_to_the_cap_cost_their_own_bytes_only(
    template: gm.Template, tmp_path: Path
) -> None:
    """65,536 claimed tensors in a sparse file read as zeros: empty names, refused as
    duplicates once read: 1.5 MB of infos after the 1.7 MB of key-values."""
    edited = template.clone()
    edited.tensor_count = gguf_header.MAX_TENSORS
    path = gm.write(gm.GGUFImage(edited.encode_header(), 120 << 20), tmp_path / "zeros.gguf")
    before = bytes_read()
    assert "appears twice" in refusal(path)
    assert bytes_read() - before < 8 << 20  # the file is 120 MB


@pytest.mark.parametrize(
    ("mutation", "expected"),
    [
        (gm.string_length("general.name", 1 << 62), "the cap is 16777216"),
        (gm.string_length("llama.block_count", 1 << 62), "the cap is 1024"),  # the key's name
        (gm.array_count("tokenizer.ggml.token_type", 1 << 62), "the file has"),
        (gm.array_count("tokenizer.ggml.merges", 1 << 62), "cannot hold them"),
        (gm.array_count("tokenizer.ggml.tokens", (1 << 20) + 1), "the cap is 1048576"),
        (gm.array_count("tokenizer.ggml.merges", (1 << 22) + 1), "4194304 strings in all"),
        (gm.value_count(1 << 40, "2^40"), "the cap is 4096"),
        (gm.nested_arrays(200_000), "holds an array of arrays"),
        (gm.nested_arrays(2), "holds an array of arrays"),
        (gm.value_type("general.name", 13), "value type 13"),
        (gm.array_item_type("tokenizer.ggml.token_type", 255), "array of type 255"),
        (gm.duplicate_key("general.name"), "'general.name' appears twice"),
        (gm.version(1), "too old"),
        (gm.version(4), "newer than this build"),
        (gm.hparam("general.alignment", gm.U32, 3), "not a power of 2"),
        (gm.hparam("general.alignment", gm.U64, 32), "requires a UINT32"),
        (gm.tensor_renamed(0, "x" * 64), "the cap is 63"),
        (gm.tensor_renamed(1, "token_embd.weight"), "'token_embd.weight' appears twice"),
        (gm.tensor_dims(0, [1, 1, 1, 1, 1], relayout=True), "5 dimensions"),
    ],
    ids=lambda value: getattr(value, "name", None),
)
def test_malformed_headers_are_refused_with_what_is_wrong(
    template: gm.Template, tmp_path: Path, mutation: gm.Mutation, expected: str
) -> None:
    path = gm.write(mutation.image(template), tmp_path / "bad.gguf")
    before = bytes_read()
    assert expected in refusal(path)
    assert bytes_read() - before < 8 << 20  # the header is 1.7 MB, the file 98 MB


def test_magic_then_garbage_is_refused(tmp_path: Path) -> None:
    rng = random.Random(15)
    for length in (0, 1, 4, 16, 20, 24, 64, 1_000, 100_000):
        for _ in range(5):
            path = tmp_path / "garbage.gguf"
            path.write_bytes(b"GGUF" + rng.randbytes(length))
            refusal(path)
    path.write_bytes(b"PK\x03\x04 a zip file")
    assert "not a GGUF file" in refusal(path)


@pytest.mark.slow  # the header cut at every byte
def test_a_header_cut_anywhere_is_refused(template: gm.Template, tmp_path: Path) -> None:
    header = template.encode_header()
    rng = random.Random(6)
    cuts = [*range(0, 200, 7), *(rng.randrange(len(header)) for _ in range(40))]
    for cut in cuts:
        path = tmp_path / "cut.gguf"
        path.write_bytes(header[:cut])
        assert "truncated" in refusal(path) or cut < 4


@pytest.mark.slow  # tracemalloc over headers with the most tensors the caps allow
def test_memory_stays_bounded_whatever_the_header_claims(
    template: gm.Template, tmp_path: Path
) -> None:
    """The most tensor infos the caps let through, kept as objects, take a few MB;
    claims past the caps take nothing (the 120 MB files are holes)."""
    at_cap = template.clone()
    at_cap.tensor_count = gguf_header.MAX_TENSORS
    files = [
        gm.write(gm.GGUFImage(at_cap.encode_header(), 120 << 20), tmp_path / "zeros.gguf"),
        gm.write(gm.huge_tensor_count_sparse().image(template), tmp_path / "claims.gguf"),
    ]
    for path in files:
        tracemalloc.start()
        try:
            refusal(path)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 16 << 20


def test_duplicate_tokens_are_found_in_the_vocabulary(
    template: gm.Template, tmp_path: Path
) -> None:
    """llama.cpp aborts on two tokens with the same text: the reader hashes the
    vocabulary on its way past and names the pair."""
    assert read_gguf_header(EMBEDDED_MODELS[SMOLLM].locate()).duplicate_tokens is None
    path = gm.write(gm.duplicate_token(100, 7_000).image(template), tmp_path / "dup.gguf")
    assert read_gguf_header(path).duplicate_tokens == (100, 7_000)
