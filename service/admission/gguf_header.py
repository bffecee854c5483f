"""A GGUF header reader whose cost is bounded whatever the file claims.

Admission needs the scalar key-values, the vocabulary's size and each tensor's
name, type, shape and data offset; never the weights. A header states counts
and lengths that a broken or hostile file can set to anything (2^40 tensors,
a 2^62-byte string, arrays nested 200k deep), so every claim is checked
against a cap and against the bytes left in the file before anything is read,
skipped or allocated, and the reader never recurses. The caps sit far above
what real models hold; a file over one is refused with the cap in the reason.

Long strings (chat templates) and long arrays (vocabularies, per-token scores)
are skipped, not decoded: their type and length are kept, their contents not.
The vocabulary's strings are hashed on the way past, because llama.cpp aborts
on two tokens with the same text; only a pair of equal hashes is read again.
"""

from __future__ import annotations

import dataclasses
import struct
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from service.errors import excerpt

MAGIC = b"GGUF"
VOCABULARY = "tokenizer.ggml.tokens"
NEWEST_VERSION = 3  # the newest GGUF version llama.cpp reads

# Caps. Real files: a few hundred to a few thousand tensors (tens of thousands at
# most), 30 to 100 keys, 262k-token vocabularies with up to ~1M merges in all,
# chat templates of tens of KB, keys of under 100 bytes.
MAX_TENSORS = 65_536
MAX_KEYS = 4_096
MAX_KEY_BYTES = 1_024
MAX_STRING_BYTES = 16 << 20
# Strings in string arrays, over the whole file: each one is a step of the walk.
MAX_ARRAY_STRINGS = 1 << 22
# Tokens in the vocabulary, each hashed to find duplicates (Gemma 3 has 262,144).
MAX_VOCABULARY = 1 << 20
# One token's text: each is read whole to be hashed.
MAX_TOKEN_BYTES = 64 << 10
MAX_ARRAY_ITEMS = 1 << 32
# llama.cpp's own limits (GGML_MAX_NAME, GGML_MAX_DIMS).
MAX_TENSOR_NAME_BYTES = 63
MAX_DIMS = 4

# What is kept in memory: short strings, short scalar arrays (per-layer values).
KEPT_STRING_BYTES = 1_024
KEPT_ARRAY_ITEMS = 1_024
_KEPT_ITEMS_IN_ALL = 65_536

# GGUF value type ids, their names and struct formats (little-endian).
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
STRING, ARRAY = 8, 9
TYPE_NAMES = {
    0: "UINT8",
    1: "INT8",
    2: "UINT16",
    3: "INT16",
    4: "UINT32",
    5: "INT32",
    6: "FLOAT32",
    7: "BOOL",
    8: "STRING",
    9: "ARRAY",
    10: "UINT64",
    11: "INT64",
    12: "FLOAT64",
}
_MIN_KEY_VALUE_BYTES = 8 + 4 + 1  # key length, value type, a one-byte value
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8  # name length, dims count, type, offset


class GGUFFormatError(ValueError):
    """The header cannot be read; the message says where and why."""


@dataclass(frozen=True)
class Skipped:
    """A string or array left unread: its type and size, not its contents."""

    value_type: int  # STRING, or the item type of an array
    length: int  # bytes of a string, items of an array


@dataclass(frozen=True)
class GGUFArray:
    item_type: int
    items: tuple[Any, ...]


@dataclass(frozen=True)
class TensorInfo:
    name: str
    ggml_type: int
    dims: tuple[int, ...]
    offset: int  # of its data, from the start of the data section

    @property
    def n_elements(self) -> int:
        count = 1
        for dim in self.dims:
            count *= dim
        return count


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    values: dict[str, Any]  # scalars, short strings, GGUFArray, or Skipped
    types: dict[str, int]  # each key's GGUF value type
    tensors: list[TensorInfo]
    data_start: int  # where the data section starts, aligned
    file_size: int
    alignment: int = 32
    # Two indices of tokenizer.ggml.tokens with the same text (llama.cpp aborts on it).
    duplicate_tokens: tuple[int, int] | None = None


class _Reader:
    """Reads forward through a file, refusing any claim larger than what is left."""

    def __init__(self, file: BinaryIO, size: int) -> None:
        self._file = file
        self.size = size
        self.position = 0
        self.kept_items = 0
        self.array_strings = 0
        self.duplicate_tokens: tuple[int, int] | None = None

    @property
    def left(self) -> int:
        return self.size - self.position

    def take(self, count: int, what: str) -> bytes:
        if count > self.left:
            raise GGUFFormatError(
                f"{what} needs {count} bytes at byte {self.position}, "
                f"past the end of the file ({self.size} bytes): the file is truncated"
            )
        data = self._file.read(count)
        if len(data) != count:  # the file shrank while being read
            raise GGUFFormatError(f"the file ends at byte {self.position + len(data)}")
        self.position += count
        return data

    def skip(self, count: int, what: str) -> None:
        if count > self.left:
            raise GGUFFormatError(
                f"{what} claims {count} bytes at byte {self.position}, more than the "
                f"{self.left} left in the file: it is truncated, or the length is garbage"
            )
        self._file.seek(count, 1)
        self.position += count

    def seek(self, position: int) -> None:
        self._file.seek(position)
        self.position = position

    def window(self, most: int) -> bytes:
        """Up to `most` bytes from here, without moving past them."""
        data = self._file.read(min(most, self.left))
        self._file.seek(-len(data), 1)
        return data

    def scalar(self, fmt: str, what: str) -> Any:
        return struct.unpack("<" + fmt, self.take(struct.calcsize("<" + fmt), what))[0]

    def u32(self, what: str) -> int:
        value: int = self.scalar("I", what)
        return value

    def u64(self, what: str) -> int:
        value: int = self.scalar("Q", what)
        return value

    def string(self, what: str, cap: int = MAX_STRING_BYTES) -> str | Skipped:
        length = self.u64(f"the length of {what}")
        if length > cap:
            raise GGUFFormatError(f"{what} claims a length of {length} bytes; the cap is {cap}")
        if length > KEPT_STRING_BYTES:
            self.skip(length, what)
            return Skipped(STRING, length)
        return self.take(length, what).decode("utf-8", errors="replace")

    def text(self, what: str, cap: int) -> str:
        """A string that must be kept whole (a key, a tensor name), of at most `cap` bytes."""
        length = self.u64(f"the length of {what}")
        if length > cap:
            raise GGUFFormatError(f"{what} is {length} bytes long; the cap is {cap}")
        return self.take(length, what).decode("utf-8", errors="replace")


def read_gguf_header(path: Path) -> GGUFHeader:
    with path.open("rb", buffering=1 << 16) as file:
        return read_gguf_header_from(file, _file_size(file))


def read_gguf_header_from(file: BinaryIO, size: int) -> GGUFHeader:
    """The header of a GGUF file of `size` bytes, read forward from the file's start:
    a local file, or a hub file read by ranges, which then moves the header alone."""
    reader = _Reader(file, size)
    if size < 4 or reader.take(4, "the magic number") != MAGIC:
        raise GGUFFormatError("the file does not start with 'GGUF': it is not a GGUF file")
    version = _version(reader)
    n_tensors, n_values = _counts(reader)
    values, types = _key_values(reader, n_values)
    alignment = _alignment(values, types)
    tensors = [_tensor_info(reader, index) for index in range(n_tensors)]
    _no_duplicate_names(tensors)
    data_start = reader.position + (-reader.position % alignment)
    duplicate = reader.duplicate_tokens
    return GGUFHeader(version, values, types, tensors, data_start, size, alignment, duplicate)


def join_parts(parts: Sequence[GGUFHeader]) -> GGUFHeader:
    """The model the parts of a split GGUF make together, as llama.cpp loads it: the
    first part's key-values (it reads no other part's but split.no), every part's
    tensors, and all their bytes. Each tensor's offset stays relative to its own
    part's data, so a file's layout is checked on its own part, never on this."""
    first = parts[0]
    if len(parts) == 1:
        return first
    tensors = [tensor for part in parts for tensor in part.tensors]
    size = sum(part.file_size for part in parts)
    return dataclasses.replace(first, tensors=tensors, file_size=size)


def _file_size(file: BinaryIO) -> int:
    file.seek(0, 2)
    size = file.tell()
    file.seek(0)
    return size


def _version(reader: _Reader) -> int:
    version = reader.u32("the GGUF version")
    if version < 2:
        raise GGUFFormatError(f"GGUF version {version} is too old for llama.cpp (2 or 3)")
    if version > NEWEST_VERSION:
        raise GGUFFormatError(
            f"GGUF version {version} is newer than this build of llama.cpp reads "
            f"({NEWEST_VERSION}), or the header is garbage"
        )
    return version


def _counts(reader: _Reader) -> tuple[int, int]:
    n_tensors, n_values = reader.u64("the tensor count"), reader.u64("the key count")
    if n_tensors > MAX_TENSORS:
        raise GGUFFormatError(
            f"the header claims {n_tensors} tensors; the cap is {MAX_TENSORS} "
            "(real models have a few thousand at most)"
        )
    if n_values > MAX_KEYS:
        raise GGUFFormatError(
            f"the header claims {n_values} key-values; the cap is {MAX_KEYS} "
            "(real models have under a hundred)"
        )
    needed = n_tensors * _MIN_TENSOR_INFO_BYTES + n_values * _MIN_KEY_VALUE_BYTES
    if needed > reader.left:
        raise GGUFFormatError(
            f"the header claims {n_tensors} tensors and {n_values} key-values, which take at "
            f"least {needed} bytes; the file has {reader.left} left: it is truncated or garbage"
        )
    return n_tensors, n_values


def _key_values(reader: _Reader, count: int) -> tuple[dict[str, Any], dict[str, int]]:
    values: dict[str, Any] = {}
    types: dict[str, int] = {}
    for index in range(count):
        key = reader.text(f"key {index}'s name", MAX_KEY_BYTES)
        if not key:
            raise GGUFFormatError(f"key {index} has an empty name")
        label = excerpt(key)  # the file's own text: shown cut short
        if key in values:
            raise GGUFFormatError(f"key {label} appears twice")
        value_type = reader.u32(f"the type of {label}")
        values[key], types[key] = _value(reader, key, value_type), value_type
    return values, types


def _value(reader: _Reader, key: str, value_type: int) -> Any:
    label = excerpt(key)
    if value_type in _SCALARS:
        return reader.scalar(_SCALARS[value_type], f"the value of {label}")
    if value_type == STRING:
        return reader.string(f"the value of {label}")
    if value_type == ARRAY:
        return _array(reader, key)
    raise GGUFFormatError(f"key {label} has value type {value_type}, which GGUF does not define")


def _array(reader: _Reader, key: str) -> GGUFArray | Skipped:
    label = excerpt(key)
    item_type = reader.u32(f"the item type of {label}")
    count = reader.u64(f"the length of {label}")
    if item_type == ARRAY:  # llama.cpp's GGUF reader refuses these too
        raise GGUFFormatError(f"key {label} holds an array of arrays, which GGUF readers refuse")
    if item_type == STRING:
        if key == VOCABULARY and count > MAX_VOCABULARY:
            raise GGUFFormatError(
                f"{label} claims {count} tokens; the cap is {MAX_VOCABULARY} "
                "(real vocabularies hold up to about 262 thousand)"
            )
        start, hashes = reader.position, array("q") if key == VOCABULARY else None
        _skip_strings(reader, label, count, hashes)
        if hashes is not None:
            reader.duplicate_tokens = _duplicate(reader, start, hashes)
        return Skipped(STRING, count)
    if item_type not in _SCALARS:
        raise GGUFFormatError(f"key {label} is an array of type {item_type}, undefined in GGUF")
    fmt = "<" + _SCALARS[item_type]
    width = struct.calcsize(fmt)
    if count > MAX_ARRAY_ITEMS or count * width > reader.left:
        raise GGUFFormatError(
            f"key {label} claims {count} items of {width} bytes; the file has {reader.left} "
            "left: it is truncated, or the length is garbage"
        )
    if count > KEPT_ARRAY_ITEMS or reader.kept_items + count > _KEPT_ITEMS_IN_ALL:
        reader.skip(count * width, f"the items of {label}")
        return Skipped(item_type, count)
    reader.kept_items += count
    data = reader.take(count * width, f"the items of {label}")
    return GGUFArray(item_type, tuple(v for (v,) in struct.iter_unpack(fmt, data)))


def _skip_strings(
    reader: _Reader, label: str, count: int, hashes: array[int] | None = None
) -> None:
    """Walk past `count` strings: each one's length must be read to find the next.
    With `hashes`, each string's hash is appended to it (for the vocabulary)."""
    if count * 8 > reader.left:
        raise GGUFFormatError(
            f"key {label} claims {count} strings; the {reader.left} bytes left in the file "
            "cannot hold them: it is truncated, or the length is garbage"
        )
    reader.array_strings += count
    if reader.array_strings > MAX_ARRAY_STRINGS:
        raise GGUFFormatError(
            f"the string arrays hold more than {MAX_ARRAY_STRINGS} strings in all ({label} "
            f"claims {count}); real vocabularies and merge lists hold about a million at most"
        )
    index = 0
    while index < count:
        if _next_length(reader) > _WINDOW_BYTES - 8:  # skipped by seeking, never read
            _skip_string(reader, label, index, hashes)
            index += 1
            continue
        walked, steps = _walk_strings(reader.window(_WINDOW_BYTES), count - index, index, hashes)
        if steps == 0:  # the window ends before the next string does
            _skip_string(reader, label, index, hashes)
            index += 1
        else:
            reader.skip(walked, f"{label}[{index}:{index + steps}]")
            index += steps


_WINDOW_BYTES = 1 << 20
_LENGTH = struct.Struct("<Q")


def _walk_strings(
    window: bytes, most: int, first: int, hashes: array[int] | None
) -> tuple[int, int]:
    """(bytes, strings) of the whole strings at the start of `window`, at most `most`;
    `first` is the index of the first one."""
    position, steps, end = 0, 0, len(window)
    unpack = _LENGTH.unpack_from
    while steps < most and position + 8 <= end:
        (length,) = unpack(window, position)
        stop = position + 8 + length
        if stop > end:
            break
        if hashes is not None:
            hashes.append(hash(_token_text(window[position + 8 : stop], first + steps)))
        position = stop
        steps += 1
    return position, steps


def _next_length(reader: _Reader) -> int:
    """The length of the string at the reader's position, read without moving past it."""
    prefix = reader.window(8)
    return _LENGTH.unpack(prefix)[0] if len(prefix) == 8 else 0


def _skip_string(reader: _Reader, label: str, index: int, hashes: array[int] | None) -> None:
    length = reader.u64(f"the length of {label}[{index}]")
    if length > MAX_STRING_BYTES:
        raise GGUFFormatError(
            f"{label}[{index}] claims {length} bytes; the cap is {MAX_STRING_BYTES}"
        )
    if hashes is not None and length > MAX_TOKEN_BYTES:
        raise GGUFFormatError(
            f"{label}[{index}] is a token of {length} bytes; the cap is {MAX_TOKEN_BYTES} "
            "(real vocabularies' longest tokens are a few hundred bytes)"
        )
    if hashes is None:
        reader.skip(length, f"{label}[{index}]")
    else:
        hashes.append(hash(_token_text(reader.take(length, f"{label}[{index}]"), index)))


def _token_text(text: bytes, index: int) -> bytes:
    """A token's text as llama.cpp keys its vocabulary: it renames empty ones."""
    return text or b"[EMPTY_%d]" % index


def _duplicate(reader: _Reader, start: int, hashes: array[int]) -> tuple[int, int] | None:
    """The first two tokens with the same text, or None. Equal hashes are candidates,
    read again to compare (a few at most: distinct texts rarely share a 64-bit hash)."""
    values = np.frombuffer(hashes, dtype=np.int64)
    order = np.argsort(values, kind="stable")
    same = np.flatnonzero(values[order[1:]] == values[order[:-1]])
    for candidate in same[:_CANDIDATES]:
        pair = int(order[candidate]), int(order[candidate + 1])
        first, second = _token_texts(reader, start, pair)
        if first == second:
            return pair
    return None


_CANDIDATES = 4


def _token_texts(reader: _Reader, start: int, pair: tuple[int, int]) -> tuple[bytes, bytes]:
    """Two tokens' texts, read again from the array starting at `start`."""
    resume = reader.position
    reader.seek(start)
    texts: dict[int, bytes] = {}
    for index in range(max(pair) + 1):
        length = reader.u64("a token's length")
        if index in pair:
            texts[index] = _token_text(reader.take(length, "a token"), index)
        else:
            reader.skip(length, "a token")
    reader.seek(resume)
    return texts[pair[0]], texts[pair[1]]


def _alignment(values: dict[str, Any], types: dict[str, int]) -> int:
    if "general.alignment" not in values:
        return 32
    alignment = values["general.alignment"]
    if types["general.alignment"] != 4:
        name = TYPE_NAMES[types["general.alignment"]]
        raise GGUFFormatError(f"general.alignment is a {name}; GGUF requires a UINT32")
    if alignment <= 0 or alignment & (alignment - 1):
        raise GGUFFormatError(f"general.alignment is {alignment}, not a power of 2")
    assert isinstance(alignment, int)
    return alignment


def _tensor_info(reader: _Reader, index: int) -> TensorInfo:
    name = reader.text(f"tensor {index}'s name", MAX_TENSOR_NAME_BYTES)
    label = excerpt(name)
    n_dims = reader.u32(f"the dimension count of {label}")
    if n_dims > MAX_DIMS:
        raise GGUFFormatError(
            f"tensor {label} has {n_dims} dimensions; ggml has at most {MAX_DIMS}"
        )
    dims = tuple(reader.scalar("q", f"the shape of {label}") for _ in range(n_dims))
    ggml_type = reader.u32(f"the type of {label}")
    offset = reader.u64(f"the data offset of {label}")
    return TensorInfo(name, ggml_type, dims, offset)


def _no_duplicate_names(tensors: list[TensorInfo]) -> None:
    seen: set[str] = set()
    for tensor in tensors:
        if tensor.name in seen:
            raise GGUFFormatError(f"tensor {excerpt(tensor.name)} appears twice")
        seen.add(tensor.name)
