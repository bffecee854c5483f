"""A GGUF header reader that reads the header and nothing else.

The `gguf` package's reader builds an object per vocabulary entry, which takes
seconds on a 262k-token vocabulary; admission only needs the scalar
key-values and each tensor's type and shape. String arrays are skipped, not
decoded; the tensor data after the header is never touched.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

MAGIC = b"GGUF"

# GGUF value type ids and their struct formats (little-endian).
_SCALARS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
_STRING, _ARRAY = 8, 9


class GGUFFormatError(ValueError):
    pass


@dataclass(frozen=True)
class TensorInfo:
    name: str
    ggml_type: int
    n_elements: int


@dataclass(frozen=True)
class GGUFHeader:
    values: dict[str, Any]
    tensors: list[TensorInfo]


class _Reader:
    def __init__(self, file: BinaryIO) -> None:
        self._file = file

    def read(self, fmt: str) -> Any:
        size = struct.calcsize("<" + fmt)
        data = self._file.read(size)
        if len(data) != size:
            raise GGUFFormatError("the file ends inside its header")
        return struct.unpack("<" + fmt, data)[0]

    def string(self) -> str:
        length = self.read("Q")
        data = self._file.read(length)
        if len(data) != length:
            raise GGUFFormatError("the file ends inside its header")
        return data.decode("utf-8", errors="replace")

    def skip_strings(self, count: int) -> None:
        for _ in range(count):
            self._file.seek(self.read("Q"), 1)

    def value(self, value_type: int) -> Any:
        if value_type in _SCALARS:
            return self.read(_SCALARS[value_type])
        if value_type == _STRING:
            return self.string()
        if value_type == _ARRAY:
            return self.array()
        raise GGUFFormatError(f"unknown GGUF value type {value_type}")

    def array(self) -> list[Any] | None:
        item_type, count = self.read("I"), self.read("Q")
        if item_type == _STRING:
            self.skip_strings(count)  # vocabularies: large, and nothing here needs them
            return None
        if item_type in _SCALARS:
            fmt = _SCALARS[item_type]
            if count > 4096:  # per-token scores and types: skip them
                self._file.seek(count * struct.calcsize("<" + fmt), 1)
                return None
            return [self.read(fmt) for _ in range(count)]
        return [self.value(item_type) for _ in range(count)]


def read_gguf_header(path: Path) -> GGUFHeader:
    with path.open("rb") as file:
        reader = _Reader(file)
        if file.read(4) != MAGIC:
            raise GGUFFormatError(f"{path.name} is not a GGUF file (bad magic)")
        version = reader.read("I")
        if version < 2:
            raise GGUFFormatError(f"{path.name}: GGUF version {version} is too old")
        n_tensors, n_values = reader.read("Q"), reader.read("Q")
        values = {}
        for _ in range(n_values):
            key = reader.string()
            values[key] = reader.value(reader.read("I"))
        tensors = [_tensor_info(reader) for _ in range(n_tensors)]
    return GGUFHeader(values, tensors)


def _tensor_info(reader: _Reader) -> TensorInfo:
    name = reader.string()
    dims = [reader.read("Q") for _ in range(reader.read("I"))]
    ggml_type = reader.read("I")
    reader.read("Q")  # offset of the data, unused
    return TensorInfo(name, ggml_type, math.prod(dims))
