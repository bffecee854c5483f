"""Split a real GGUF into parts the way llama.cpp's `gguf-split` does, with gguf-py.

The first part carries every key-value of the source, then split.no (UINT16, 0),
split.count (UINT16, N) and split.tensors.count (INT32, every part's tensors),
and its share of the tensors; each later part carries the three split keys
alone, split.no being its index, and its tensors. Tensor data is copied raw
(its ggml type and shape kept), so llama.cpp loads the parts as it loads the
source: tests/test_split_gguf.py checks that it does.
"""

from __future__ import annotations

import struct
from functools import lru_cache
from pathlib import Path

import gguf

SPLIT_NO = gguf.Keys.Split.LLM_KV_SPLIT_NO
SPLIT_COUNT = gguf.Keys.Split.LLM_KV_SPLIT_COUNT
SPLIT_TENSORS = gguf.Keys.Split.LLM_KV_SPLIT_TENSORS_COUNT
# Where set_split_key looks for a key: past SmolLM2's or Gemma 3's whole header.
_HEADER_BYTES = 16 << 20
_FORMATS = {
    gguf.GGUFValueType.UINT16: "<H",
    gguf.GGUFValueType.INT16: "<h",
    gguf.GGUFValueType.INT32: "<i",
}


def split_name(prefix: str, part: int, parts: int) -> str:
    """llama.cpp's name for part `part` (from 1) of `parts`: PREFIX-0000K-of-0000N.gguf."""
    return f"{prefix}-{part:05d}-of-{parts:05d}.gguf"


def write_split_gguf(source: Path, directory: Path, parts: int) -> list[Path]:
    """`source` split into `parts` files in `directory`, named after it, first part
    first; the tensors shared out in order, as evenly as they go."""
    reader = _reader(source)
    tensors = list(reader.tensors)
    share = -(-len(tensors) // parts)
    paths = [directory / split_name(source.stem, part, parts) for part in range(1, parts + 1)]
    for index, path in enumerate(paths):
        writer = gguf.GGUFWriter(path, _architecture(reader))
        if index == 0:
            _copy_key_values(reader, writer)
        else:  # gguf-split writes the split keys alone into a later part
            del writer.kv_data[0][gguf.Keys.General.ARCHITECTURE]
        writer.add_uint16(SPLIT_NO, index)
        writer.add_uint16(SPLIT_COUNT, parts)
        writer.add_int32(SPLIT_TENSORS, len(tensors))
        _write(writer, tensors[index * share : (index + 1) * share])
    return paths


def set_split_key(
    path: Path, key: str, value: int, value_type: gguf.GGUFValueType | None = None
) -> None:
    """Overwrite a split key's value in place and, with `value_type`, its type (one of
    the same width: UINT16 to INT16). The key is found by its bytes (its length, then
    its name): gguf.GGUFReader would parse the whole vocabulary first, seconds a file."""
    needle = struct.pack("<Q", len(key)) + key.encode()
    with path.open("r+b") as file:
        at = file.read(_HEADER_BYTES).find(needle)
        assert at >= 0, key
        file.seek(at + len(needle))
        stored = gguf.GGUFValueType(struct.unpack("<I", file.read(4))[0])
        kind = stored if value_type is None else value_type
        file.seek(at + len(needle))
        file.write(struct.pack("<I", kind) + struct.pack(_FORMATS[kind], value))


@lru_cache(maxsize=2)
def _reader(source: Path) -> gguf.GGUFReader:
    """A source read once for every split made of it: reading takes seconds."""
    return gguf.GGUFReader(source)


def _architecture(reader: gguf.GGUFReader) -> str:
    field = reader.get_field(gguf.Keys.General.ARCHITECTURE)
    assert field is not None
    return str(field.contents())


def _copy_key_values(reader: gguf.GGUFReader, writer: gguf.GGUFWriter) -> None:
    """Every key-value but the reader's own (GGUF.*) and the architecture, which the
    writer adds first, as the source has it; types and array item types kept."""
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == gguf.Keys.General.ARCHITECTURE:
            continue
        kind = field.types[0]
        sub_type = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        if field.name == gguf.Keys.General.ALIGNMENT:
            writer.data_alignment = int(field.contents())
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub_type)


def _write(writer: gguf.GGUFWriter, tensors: list[gguf.ReaderTensor]) -> None:
    for tensor in tensors:
        data = tensor.data
        writer.add_tensor_info(tensor.name, data.shape, data.dtype, data.nbytes, tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor in tensors:
        writer.write_tensor_data(tensor.data)
    writer.close()
