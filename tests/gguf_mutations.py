"""Mutated GGUF files, derived from a real model's header, for fuzzing admission.

`Template.parse` reads a real GGUF file's header into editable parts: the
key-values (each kept as its encoded bytes, so a 262k-token vocabulary costs
one bytes object, not 262k Python strings) and the tensor infos. A `Mutation`
edits a copy and encodes it into a `GGUFImage`: the header's bytes and the size
the file should have. `write` puts the header on disk and extends the file to
that size with a hole: the tensor data reads as zeros and takes no disk, so a
mutated 250 MB model costs the few MB of its header.

`generate(template, seed, count)` draws mutations with `random.Random(seed)`
from three families:
- structure: magic then garbage, version, tensor and key counts, string and
  array lengths, value types, nested arrays, duplicate keys, truncation;
- hyper-parameters: `<arch>.*` and tokenizer keys set to 0, 1, huge, values
  of the wrong type, per-layer arrays of the wrong length, or removed;
- tensor infos: shapes, dimension counts, ggml types, data offsets, names.

Only the header is mutated, never the vocabulary's strings. `issue_cases`
names the inputs of issue 15 one by one.
"""

from __future__ import annotations

import copy
import math
import mmap
import random
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf

MAGIC = b"GGUF"
# GGUF value types.
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
_SCALAR_FORMATS = {
    U8: "B",
    I8: "b",
    U16: "H",
    I16: "h",
    U32: "I",
    I32: "i",
    F32: "f",
    BOOL: "?",
    U64: "Q",
    I64: "q",
    F64: "d",
}
HUGE = 1 << 62


def _pack(fmt: str, *values: object) -> bytes:
    return struct.pack("<" + fmt, *values)


def encode_string(text: str | bytes) -> bytes:
    data = text.encode() if isinstance(text, str) else text
    return _pack("Q", len(data)) + data


# --- the template: a real header, editable ----------------------------------------------


@dataclass
class KeyValue:
    key: str
    value_type: int
    payload: bytes  # the value as encoded after its type id

    def scalar(self) -> Any:
        return struct.unpack("<" + _SCALAR_FORMATS[self.value_type], self.payload)[0]


@dataclass
class TensorSpec:
    name: str
    dims: list[int]
    ggml_type: int
    offset: int

    def nbytes(self) -> int:
        block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(self.ggml_type)]
        return math.prod(self.dims) // block * size


@dataclass
class GGUFImage:
    """A file to write: its header bytes, then a hole up to `size` bytes in all."""

    header: bytes
    size: int


@dataclass
class Template:
    version: int
    values: list[KeyValue]
    tensors: list[TensorSpec]
    alignment: int = 32
    data_bytes: int = 0
    # Raw overrides of the counts the header states; None: the real counts.
    tensor_count: int | None = None
    value_count: int | None = None

    @classmethod
    def parse(cls, path: Path) -> Template:
        with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as view:
            return _parse(view, path.stat().st_size)

    @property
    def architecture(self) -> str:
        payload = self.get("general.architecture").payload
        return payload[8:].decode()

    def clone(self) -> Template:
        return copy.deepcopy(self)

    def get(self, key: str) -> KeyValue:
        return next(kv for kv in self.values if kv.key == key)

    def has(self, key: str) -> bool:
        return any(kv.key == key for kv in self.values)

    def put(self, key: str, value_type: int, payload: bytes) -> None:
        """Replace the key's value in place, or append the key."""
        for kv in self.values:
            if kv.key == key:
                kv.value_type, kv.payload = value_type, payload
                return
        self.values.append(KeyValue(key, value_type, payload))

    def put_scalar(self, key: str, value_type: int, value: object) -> None:
        self.put(key, value_type, _pack(_SCALAR_FORMATS[value_type], value))

    def put_string(self, key: str, text: str) -> None:
        self.put(key, STRING, encode_string(text))

    def put_array(self, key: str, item_type: int, items: list[object]) -> None:
        body = b"".join(_pack(_SCALAR_FORMATS[item_type], item) for item in items)
        self.put(key, ARRAY, _pack("IQ", item_type, len(items)) + body)

    def drop(self, key: str) -> None:
        self.values = [kv for kv in self.values if kv.key != key]

    def tensor(self, name: str) -> TensorSpec:
        return next(t for t in self.tensors if t.name == name)

    def relayout(self) -> None:
        """Offsets as a writer would lay them out: in order, each aligned."""
        offset = 0
        for tensor in self.tensors:
            tensor.offset = offset
            offset += _align(tensor.nbytes(), self.alignment)
        self.data_bytes = offset

    def encode(self) -> GGUFImage:
        header = self.encode_header()
        return GGUFImage(header, _align(len(header), self.alignment) + self.data_bytes)

    def encode_header(self) -> bytes:
        tensors = self.len_or(self.tensor_count, self.tensors)
        values = self.len_or(self.value_count, self.values)
        parts = [MAGIC, _pack("IQQ", self.version, tensors, values)]
        for kv in self.values:
            parts += [encode_string(kv.key), _pack("I", kv.value_type), kv.payload]
        for t in self.tensors:
            parts += [encode_string(t.name), _pack("I", len(t.dims))]
            parts += [_pack("Q", dim & (2**64 - 1)) for dim in t.dims]
            parts.append(_pack("IQ", t.ggml_type & (2**32 - 1), t.offset & (2**64 - 1)))
        return b"".join(parts)

    @staticmethod
    def len_or(override: int | None, items: list[KeyValue] | list[TensorSpec]) -> int:
        return len(items) if override is None else override


def _align(offset: int, alignment: int) -> int:
    return offset + (-offset % alignment)


def _parse(view: mmap.mmap, file_size: int) -> Template:
    version, n_tensors, n_values = struct.unpack_from("<IQQ", view, 4)
    position = 24
    values = []
    for _ in range(n_values):
        key, position = _string_at(view, position)
        (value_type,) = struct.unpack_from("<I", view, position)
        end = _value_end(view, position + 4, value_type)
        values.append(KeyValue(key, value_type, bytes(view[position + 4 : end])))
        position = end
    tensors = []
    for _ in range(n_tensors):
        name, position = _string_at(view, position)
        (n_dims,) = struct.unpack_from("<I", view, position)
        dims = list(struct.unpack_from(f"<{n_dims}Q", view, position + 4))
        position += 4 + 8 * n_dims
        ggml_type, offset = struct.unpack_from("<IQ", view, position)
        position += 12
        tensors.append(TensorSpec(name, dims, ggml_type, offset))
    template = Template(version, values, tensors)
    if template.has("general.alignment"):
        template.alignment = int(template.get("general.alignment").scalar())
    template.data_bytes = file_size - _align(position, template.alignment)
    return template


def _string_at(view: mmap.mmap, position: int) -> tuple[str, int]:
    (length,) = struct.unpack_from("<Q", view, position)
    end = position + 8 + length
    return bytes(view[position + 8 : end]).decode(), end


def _value_end(view: mmap.mmap, position: int, value_type: int) -> int:
    if value_type in _SCALAR_FORMATS:
        return position + struct.calcsize(_SCALAR_FORMATS[value_type])
    if value_type == STRING:
        length: int = struct.unpack_from("<Q", view, position)[0]
        return position + 8 + length
    item_type: int
    count: int
    item_type, count = struct.unpack_from("<IQ", view, position)
    position += 12
    if item_type in _SCALAR_FORMATS:
        return position + count * struct.calcsize(_SCALAR_FORMATS[item_type])
    for _ in range(count):
        position = _value_end(view, position, item_type)
    return position


# Sparse files larger than this are cut to it: some filesystems refuse larger ones,
# and a file that ends inside its data is one more mutation, not a lost one.
MAX_FILE_BYTES = 1 << 36


def write(image: GGUFImage, path: Path) -> Path:
    """The header, then a hole (zeros, no disk) up to the image's size."""
    with path.open("wb") as file:
        file.write(image.header)
        file.truncate(max(min(image.size, MAX_FILE_BYTES), len(image.header)))
    return path


# --- mutations --------------------------------------------------------------------------


@dataclass(frozen=True)
class Mutation:
    name: str
    family: str  # "structure", "hparam" or "tensor"
    build: Callable[[Template], GGUFImage] = field(repr=False, compare=False)

    def image(self, template: Template) -> GGUFImage:
        return self.build(template.clone())


def _edited(edit: Callable[[Template], None]) -> Callable[[Template], GGUFImage]:
    def build(template: Template) -> GGUFImage:
        edit(template)
        return template.encode()

    return build


def _bytes_edit(edit: Callable[[Template, bytearray], bytes]) -> Callable[[Template], GGUFImage]:
    """A mutation of the encoded header's bytes; the file keeps its data section."""

    def build(template: Template) -> GGUFImage:
        image = template.encode()
        header = edit(template, bytearray(image.header))
        return GGUFImage(header, image.size - len(image.header) + len(header))

    return build


def _key_offset(header: bytearray, key: str) -> int:
    """Where the key's length field starts in the encoded header."""
    return header.index(encode_string(key))


def _value_offset(header: bytearray, key: str) -> int:
    """Where the key's value (after its type id) starts in the encoded header."""
    return _key_offset(header, key) + 8 + len(key.encode()) + 4


# Structure.


def garbage_after_magic(rng: random.Random) -> Mutation:
    length = rng.choice([0, 4, 20, 24, 100, 4096])
    junk = rng.randbytes(length)

    def build(template: Template) -> GGUFImage:
        return GGUFImage(MAGIC + junk, 4 + length)

    return Mutation(f"magic then {length} random bytes", "structure", build)


def version(value: int) -> Mutation:
    return Mutation(
        f"version {value}", "structure", _edited(lambda t: setattr(t, "version", value))
    )


def tensor_count(value: int | Callable[[int], int], label: str) -> Mutation:
    def edit(t: Template) -> None:
        t.tensor_count = value(len(t.tensors)) if callable(value) else value

    return Mutation(f"tensor count {label}", "structure", _edited(edit))


def value_count(value: int | Callable[[int], int], label: str) -> Mutation:
    def edit(t: Template) -> None:
        t.value_count = value(len(t.values)) if callable(value) else value

    return Mutation(f"key-value count {label}", "structure", _edited(edit))


def huge_tensor_count_sparse(size: int = 120 << 20) -> Mutation:
    """Issue item 6: a header claiming 2^40 tensors, in a `size`-byte sparse file."""

    def edit(t: Template) -> GGUFImage:
        t.tensor_count = 1 << 40
        return GGUFImage(t.encode_header(), size)

    return Mutation(f"tensor count 2^40 in a {size >> 20} MB sparse file", "structure", edit)


def string_length(key: str, length: int) -> Mutation:
    """The length field of a string value (or of the key itself when the value is not one)."""

    def edit(t: Template, header: bytearray) -> bytes:
        kv = t.get(key)
        at = _value_offset(header, key) if kv.value_type == STRING else _key_offset(header, key)
        header[at : at + 8] = _pack("Q", length)
        return bytes(header)

    return Mutation(f"{key}: string length {length}", "structure", _bytes_edit(edit))


def array_count(key: str, count: int) -> Mutation:
    def edit(t: Template, header: bytearray) -> bytes:
        at = _value_offset(header, key) + 4
        header[at : at + 8] = _pack("Q", count)
        return bytes(header)

    return Mutation(f"{key}: array count {count}", "structure", _bytes_edit(edit))


def array_item_type(key: str, item_type: int) -> Mutation:
    def edit(t: Template, header: bytearray) -> bytes:
        at = _value_offset(header, key)
        header[at : at + 4] = _pack("I", item_type)
        return bytes(header)

    return Mutation(f"{key}: array item type {item_type}", "structure", _bytes_edit(edit))


def value_type(key: str, new_type: int) -> Mutation:
    def edit(t: Template, header: bytearray) -> bytes:
        at = _value_offset(header, key) - 4
        header[at : at + 4] = _pack("I", new_type & (2**32 - 1))
        return bytes(header)

    return Mutation(f"{key}: value type {new_type}", "structure", _bytes_edit(edit))


def nested_arrays(depth: int, key: str = "general.nested") -> Mutation:
    """An array of an array of ... `depth` deep, with one u8 at the bottom."""

    def edit(t: Template) -> None:
        payload = _pack("IQ", ARRAY, 1) * (depth - 1) + _pack("IQ", U8, 1) + b"\x07"
        t.values.insert(1, KeyValue(key, ARRAY, payload))

    return Mutation(f"arrays nested {depth} deep", "structure", _edited(edit))


def duplicate_key(key: str) -> Mutation:
    def edit(t: Template) -> None:
        t.values.append(copy.deepcopy(t.get(key)))

    return Mutation(f"{key} twice", "structure", _edited(edit))


def truncated(
    fraction_of_header: float | None = None, data_fraction: float | None = None
) -> Mutation:
    """The file cut inside its header, or its data section cut short."""

    def build(t: Template) -> GGUFImage:
        image = t.encode()
        if fraction_of_header is not None:
            cut = int(len(image.header) * fraction_of_header)
            return GGUFImage(image.header[:cut], cut)
        start = image.size - t.data_bytes
        return GGUFImage(image.header, start + int(t.data_bytes * (data_fraction or 0.0)))

    where = (
        f"header at {fraction_of_header:.3f}"
        if fraction_of_header is not None
        else f"data at {data_fraction:.3f}"
    )
    return Mutation(f"truncated in the {where}", "structure", build)


def duplicate_token(source: int, target: int) -> Mutation:
    """Token `target` of the vocabulary given token `source`'s text. The one edit of the
    vocabulary's contents here: llama.cpp aborts on it, so admission must find it."""
    return Mutation(
        f"token {target} = token {source}",
        "structure",
        _edited(lambda t: copy_token(t, source, target)),
    )


def copy_token(template: Template, source: int, target: int) -> None:
    kv = template.get("tokenizer.ggml.tokens")
    item_type, count = struct.unpack_from("<IQ", kv.payload)
    texts, position = [], 12
    for _ in range(count):
        (length,) = struct.unpack_from("<Q", kv.payload, position)
        texts.append(kv.payload[position + 8 : position + 8 + length])
        position += 8 + length
    texts[target] = texts[source]
    kv.payload = _pack("IQ", item_type, count) + b"".join(map(encode_string, texts))


# Hyper-parameters.


def hparam(key: str, value_type: int, value: object) -> Mutation:
    def edit(t: Template) -> None:
        name = _arch_key(t, key)
        if value_type == STRING:
            t.put_string(name, str(value))
        else:
            t.put_scalar(name, value_type, value)

    return Mutation(f"{key} = {value!r} (type {value_type})", "hparam", _edited(edit))


def hparam_array(key: str, length: int | Callable[[int], int], item: int, label: str) -> Mutation:
    """A per-layer array: `length` items (a callable of the block count) of `item`."""

    def edit(t: Template) -> None:
        layers = int(t.get(_arch_key(t, "{arch}.block_count")).scalar())
        count = length(layers) if callable(length) else length
        t.put_array(_arch_key(t, key), U32, [item] * count)

    return Mutation(f"{key} = [{item}] * {label}", "hparam", _edited(edit))


def removed(key: str) -> Mutation:
    return Mutation(f"{key} removed", "hparam", _edited(lambda t: t.drop(_arch_key(t, key))))


def _arch_key(template: Template, key: str) -> str:
    return key.replace("{arch}", template.architecture)


# Tensor infos.


def _tensor_edit(
    label: str, edit: Callable[[Template, TensorSpec], None], *, relayout: bool, pick: str | int
) -> Mutation:
    def apply(t: Template) -> None:
        tensor = t.tensor(pick) if isinstance(pick, str) else t.tensors[pick % len(t.tensors)]
        edit(t, tensor)
        if relayout:
            t.relayout()

    suffix = ", offsets laid out again" if relayout else ""
    return Mutation(f"tensor {pick}: {label}{suffix}", "tensor", _edited(apply))


def tensor_dims(pick: str | int, dims: list[int], *, relayout: bool) -> Mutation:
    return _tensor_edit(
        f"dims {dims}", lambda t, x: setattr(x, "dims", dims), relayout=relayout, pick=pick
    )


def tensor_dim_scaled(pick: str | int, axis: int, delta: int, *, relayout: bool) -> Mutation:
    def edit(t: Template, tensor: TensorSpec) -> None:
        if axis < len(tensor.dims):
            tensor.dims[axis] = max(tensor.dims[axis] + delta, 0)

    return _tensor_edit(f"dim {axis} {delta:+d}", edit, relayout=relayout, pick=pick)


def tensor_type(pick: str | int, ggml_type: int) -> Mutation:
    def edit(t: Template, tensor: TensorSpec) -> None:
        tensor.ggml_type = ggml_type

    relayout = ggml_type in {int(q) for q in gguf.GGMLQuantizationType}
    return _tensor_edit(f"type {ggml_type}", edit, relayout=relayout, pick=pick)


def tensor_offset(pick: str | int, change: Callable[[int], int], label: str) -> Mutation:
    def edit(t: Template, tensor: TensorSpec) -> None:
        tensor.offset = change(tensor.offset)

    return _tensor_edit(f"offset {label}", edit, relayout=False, pick=pick)


def tensor_renamed(pick: str | int, name: str | Callable[[Template], str]) -> Mutation:
    def edit(t: Template, tensor: TensorSpec) -> None:
        tensor.name = name(t) if callable(name) else name

    label = name if isinstance(name, str) else "computed"
    return _tensor_edit(f"renamed {label}", edit, relayout=False, pick=pick)


def tensor_removed(pick: str | int) -> Mutation:
    def apply(t: Template) -> None:
        index = (
            next(i for i, x in enumerate(t.tensors) if x.name == pick)
            if isinstance(pick, str)
            else pick
        )
        del t.tensors[index % len(t.tensors)]
        t.relayout()

    return Mutation(f"tensor {pick} removed", "tensor", _edited(apply))


# --- the named cases of issue 15, and the seeded generator -------------------------------


def issue_cases() -> list[Mutation]:
    """Issue 15, items 2, 6 and 8, on a real model's header."""
    return [
        hparam("{arch}.block_count", U32, 0),
        hparam("{arch}.block_count", U32, 600),
        huge_tensor_count_sparse(),
        garbage_after_magic(random.Random(15)),
        string_length("general.name", 1 << 62),
        nested_arrays(200_000),
    ]


_INT_KEYS = [
    "{arch}.block_count",
    "{arch}.context_length",
    "{arch}.embedding_length",
    "{arch}.feed_forward_length",
    "{arch}.attention.head_count",
    "{arch}.attention.head_count_kv",
    "{arch}.rope.dimension_count",
    "{arch}.attention.key_length",
    "{arch}.attention.value_length",
    "{arch}.vocab_size",
    "{arch}.expert_count",
    "{arch}.expert_used_count",
    "{arch}.expert_group_count",
    "{arch}.expert_group_used_count",
    "{arch}.nextn_predict_layers",
    "{arch}.attention.sliding_window",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "general.alignment",
    "general.file_type",
]
_FLOAT_KEYS = [
    "{arch}.rope.freq_base",
    "{arch}.attention.layer_norm_rms_epsilon",
    "{arch}.rope.scaling.factor",
]
_STRING_KEYS = ["{arch}.rope.scaling.type", "tokenizer.ggml.model", "general.architecture"]
_PER_LAYER_KEYS = [
    "{arch}.attention.head_count",
    "{arch}.attention.head_count_kv",
    "{arch}.feed_forward_length",
    "{arch}.expert_used_count",
]
_WRONG_TYPES: list[tuple[int, object]] = [(STRING, "abc"), (F32, 1.5), (BOOL, True), (F64, 1e300)]
_INT_VALUES = [
    0,
    1,
    2,
    3,
    5,
    7,
    8,
    33,
    64,
    256,
    511,
    512,
    513,
    600,
    4096,
    1 << 20,
    2**31,
    2**32 - 1,
]


def generate(template: Template, seed: int, count: int) -> list[Mutation]:
    """`count` mutations of the template, drawn reproducibly from `seed`."""
    rng = random.Random(seed)
    makers = [_structure, _hparam, _hparam, _tensor, _tensor]
    return [rng.choice(makers)(template, rng) for _ in range(count)]


def _structure(template: Template, rng: random.Random) -> Mutation:
    keys = [kv.key for kv in template.values]
    arrays = [kv.key for kv in template.values if kv.value_type == ARRAY]
    strings = [kv.key for kv in template.values if kv.value_type == STRING]
    choices: list[Callable[[], Mutation]] = [
        lambda: garbage_after_magic(rng),
        lambda: version(rng.choice([0, 1, 2, 4, 2**32 - 1])),
        lambda: tensor_count(rng.choice([0, 1 << 40, 2**63, 2**64 - 1]), "set"),
        lambda: tensor_count(lambda n: n + rng.choice([-1, 1, 100]), "off by some"),
        lambda: value_count(rng.choice([0, 1 << 40, 2**64 - 1]), "set"),
        lambda: value_count(lambda n: n + rng.choice([-1, 1, 100]), "off by some"),
        lambda: string_length(rng.choice(strings), rng.choice([0, 1 << 20, HUGE, 2**64 - 1])),
        lambda: string_length(rng.choice(keys), rng.choice([0, 65, 1 << 16, HUGE])),
        lambda: array_count(rng.choice(arrays), rng.choice([0, 1, 1 << 30, HUGE])),
        lambda: array_item_type(rng.choice(arrays), rng.choice([ARRAY, 13, 255, U8, F64])),
        lambda: value_type(rng.choice(keys), rng.choice([ARRAY, STRING, 13, 255, -1, U64])),
        lambda: nested_arrays(rng.choice([2, 64, 1000, 50_000])),
        lambda: duplicate_key(rng.choice(keys)),
        lambda: truncated(fraction_of_header=rng.random()),
        lambda: truncated(data_fraction=rng.random()),
    ]
    return rng.choice(choices)()


def _hparam(template: Template, rng: random.Random) -> Mutation:
    choices: list[Callable[[], Mutation]] = [
        lambda: hparam(rng.choice(_INT_KEYS), U32, rng.choice(_INT_VALUES)),
        lambda: hparam(rng.choice(_INT_KEYS), rng.choice([I32, I64]), -rng.choice([1, 2**31])),
        lambda: hparam(rng.choice(_INT_KEYS), *rng.choice(_WRONG_TYPES)),
        lambda: hparam(
            rng.choice(_FLOAT_KEYS), F32, rng.choice([0.0, -1.0, math.nan, math.inf, 1e30])
        ),
        lambda: hparam(rng.choice(_STRING_KEYS), STRING, rng.choice(["", "bogus", "yarn", "none"])),
        lambda: hparam_array(
            rng.choice(_PER_LAYER_KEYS),
            rng.choice([lambda n: n - 1, lambda n: n + 1, lambda n: 0, lambda n: n]),
            rng.choice([0, 1, 3, 9, 64, 2**32 - 1]),
            "a length near the block count",
        ),
        lambda: removed(rng.choice(_INT_KEYS + _FLOAT_KEYS + _STRING_KEYS)),
    ]
    return rng.choice(choices)()


def _tensor(template: Template, rng: random.Random) -> Mutation:
    index = rng.randrange(len(template.tensors))
    layers = int(template.get(f"{template.architecture}.block_count").scalar())
    choices: list[Callable[[], Mutation]] = [
        lambda: tensor_dims(
            index,
            rng.choice([[], [0], [32, 0], [1] * 5, [2**62, 2**62], [2**63 + 1]]),
            relayout=rng.random() < 0.5,
        ),
        lambda: tensor_dim_scaled(
            index,
            rng.choice([0, 1]),
            rng.choice([-256, -32, -1, 1, 32, 256]),
            relayout=rng.random() < 0.7,
        ),
        lambda: tensor_type(index, rng.choice([*range(0, 44), 4000, 2**31])),
        lambda: tensor_offset(index, lambda o: o + rng.choice([1, 32, 1 << 40]), "moved"),
        lambda: tensor_offset(index, lambda o: 0, "zero"),
        lambda: tensor_renamed(
            index,
            rng.choice(
                [
                    f"blk.{layers}.attn_q.weight",
                    "blk.999.ffn_up.weight",
                    "x" * 70,
                    "not_a_tensor.weight",
                    template.tensors[0].name,
                ]
            ),
        ),
        lambda: tensor_removed(index),
    ]
    return rng.choice(choices)()


def written(
    mutations: list[Mutation], template: Template, directory: Path
) -> Iterator[tuple[Mutation, Path]]:
    """Each mutation written to its own file in `directory`, one at a time."""
    for index, mutation in enumerate(mutations):
        yield mutation, write(mutation.image(template), directory / f"mutation-{index:03d}.gguf")
