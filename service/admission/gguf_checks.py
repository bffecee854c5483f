"""Whether llama.cpp can load and run a GGUF file, judged from its header alone.

llama.cpp trusts a model's hyper-parameters. Loaded in a child process, the
embedded SmolLM2 (llama) and Gemma 3 files, each mutated one value at a time
or at random (tests/gguf_mutations.py), showed what takes the whole process
down rather than failing the load:
- SIGABRT at load (GGML_ASSERTs in load_hparams): block_count 0 or over 512;
  nextn_predict_layers over block_count; an expert count with no expert used
  per token, or experts used (or grouped) in a model without experts; an
  unknown rope.scaling.type;
- SIGABRT at load: tensor data not 32-byte aligned in the file (alignment 1
  to 16); two tokens of the vocabulary with the same text;
- SIGABRT at the first decode: a NaN norm epsilon (ggml asserts eps >= 0); a
  rope dimension count odd or larger than the head (Gemma 3; 0 hangs it); a
  sliding window near 2^31; a norm's weights in any type but F32;
- SIGSEGV at the first decode: integer, F64 or Q8_K weights;
- SIGABRT at the first prompt: tokenizer.ggml.model "none" (no vocabulary); a
  BOS token to add where the file names none and its tokenizer has no default.
Shapes that disagree with the hyper-parameters, wrong key types and per-layer
arrays of the wrong length made llama.cpp raise instead, which the backend
reports; they are refused here too, with the numbers that disagree, so that
a broken file is refused by Admit before anything is loaded.

A split GGUF (NAME-00001-of-0000N.gguf and the parts beside it) is one model in
N files: llama.cpp reads the first part's key-values and every part's tensors,
after checking the split metadata (see `_split_problem`; a later part whose
split.no is not a UINT16 aborts it). Each file's layout is checked against its
own header and size, the model on all the parts' tensors together.

`gguf_problem` runs every check in order and returns the first reason found,
or None. tests/test_model_checks.py loads admitted mutations of a real file
in a child process to keep this list honest.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

from service.admission.ggml_types import NOT_WEIGHT_TYPES, block_bytes, block_size, type_name
from service.admission.gguf_header import (
    ARRAY,
    STRING,
    TYPE_NAMES,
    GGUFArray,
    GGUFHeader,
    Skipped,
    TensorInfo,
    join_parts,
)
from service.errors import excerpt

# llama.cpp's limits (LLAMA_MAX_LAYERS, LLAMA_MAX_EXPERTS) and known values.
MAX_LAYERS = 512
MAX_EXPERTS = 1024
ROPE_SCALING_TYPES = ("none", "linear", "yarn", "longrope")
_INT32_MAX = 2**31 - 1
# Gemma 3 with a window of 1.6e9 ran; 2.1e9 to 4.29e9 aborted at the first decode.
MAX_SLIDING_WINDOW = 2**30
_INT64_MAX = 2**63 - 1
_UINT16, _UINT32, _INT32, _FLOAT32, _BOOL = 2, 4, 5, 6, 7
_F32_TENSOR = 0  # ggml's F32 tensor type
# ggml's TENSOR_ALIGNMENT: a mapped tensor's data must start on such a boundary.
TENSOR_ALIGNMENT = 32

# Architectures whose attention and feed-forward tensors llama.cpp creates with
# the plain shapes checked in `_shape_problem` (read in its src/models/*.cpp).
STANDARD_SHAPES = frozenset(
    {"llama", "gemma", "gemma2", "gemma3", "granite", "smollm3", "mistral3", "exaone", "arcee"}
)
# tokenizer.ggml.model values llama.cpp builds a tokenizer for; "none" and
# "no_vocab" load, but the first prompt aborts the process.
TOKENIZERS = (
    "llama",
    "bert",
    "gpt2",
    "hybriddna",
    "whitespace",
    "t5",
    "rwkv",
    "test",
    "plamo2",
    "gemma4",
)
_NO_VOCABULARY = ("none", "no_vocab")
# Tokens llama.cpp adds around a prompt when asked to, and the id each needs.
_ADDED_TOKENS = (
    ("tokenizer.ggml.add_bos_token", "tokenizer.ggml.bos_token_id"),
    ("tokenizer.ggml.add_eos_token", "tokenizer.ggml.eos_token_id"),
    ("tokenizer.ggml.add_sep_token", "tokenizer.ggml.seperator_token_id"),  # llama.cpp's spelling
)
# llama.cpp's (BOS, EOS, separator) ids for a tokenizer whose file names none.
_DEFAULT_TOKEN_IDS: dict[str, tuple[int | None, int | None, int | None]] = {
    "llama": (1, 2, None),
    "bert": (101, None, 102),
    "gpt2": (11, 11, None),
    "hybriddna": (11, 11, None),
    "whitespace": (11, 11, None),
    "t5": (None, 1, None),
    "plamo2": (1, 2, None),
}
# Pre-tokenizers that drop the BOS default.
_PRE_WITHOUT_BOS = frozenset({"chatglm-bpe", "glm4", "glm5"})
# Architectures where llama.cpp requires the rotary dimensions to fill the head.
_ROPE_FILLS_HEAD = frozenset({"llama", "deci", "falcon", "llama-embed"})
# Speculative-decoding drafts size their embeddings by another model's vocabulary.
_OWN_VOCABULARY_EXCEPTIONS = frozenset({"eagle3", "dflash"})
# llama.cpp turns a single expert of these into a dense model before its checks.
_ONE_EXPERT_IS_DENSE = frozenset({"hunyuan-dense", "hunyuan_vl"})

_BLOCK_INDEX = re.compile(r"blk\.(\d+)\.")


class _Refusal(Exception):
    """Raised inside a check by the value readers; the message is the reason."""


def gguf_problem(parts: Sequence[GGUFHeader], names: Sequence[str]) -> str | None:
    """The first reason llama.cpp could not load or run this model, or None. `parts` are
    the headers of its files and `names` their names: one file, or every part of a
    split GGUF in order. The split metadata and each file's layout are checked per
    file, the hyper-parameters and tensors on every part's tensors together."""
    try:
        problem = _split_problem(parts, names) or _layouts_problem(parts, names)
        return problem or _model_problem(_Model(join_parts(parts)))
    except _Refusal as refusal:
        return str(refusal)


def split_count_problem(first: GGUFHeader, names: Sequence[str]) -> str | None:
    """Whether the first file's split.count says as many parts as the file names do;
    checked before the other parts are read, so a file that lies costs one header."""
    try:
        return _split_count_problem(first, names)
    except _Refusal as refusal:
        return str(refusal)


def _model_problem(model: _Model) -> str | None:
    for check in _CHECKS:
        problem = check(model)
        if problem is not None:
            return problem
    return None


@dataclass(frozen=True)
class _Model:
    """The header, with hyper-parameters read the way llama.cpp reads them."""

    header: GGUFHeader

    @cached_property
    def arch(self) -> str:
        value = self.header.values.get("general.architecture")
        return value if isinstance(value, str) else ""

    def key(self, name: str) -> str:
        return f"{self.arch}.{name}"

    def has(self, name: str) -> bool:
        return self.key(name) in self.header.values

    def u32(self, name: str, default: int | None = None) -> int:
        """A hyper-parameter llama.cpp reads as a UINT32 (it takes no other type)."""
        key = self.key(name)
        if key not in self.header.values:
            if default is None:
                raise _Refusal(f"the file has no {key}, which llama.cpp requires")
            return default
        self.expect_type(key, _UINT32)
        value: int = self.header.values[key]
        return value

    def f32(self, key: str) -> float:
        self.expect_type(key, _FLOAT32)
        value: float = self.header.values[key]
        return value

    def per_layer(self, name: str, default: list[int]) -> list[int]:
        """A UINT32 for every layer, or an array of one value per layer."""
        key = self.key(name)
        value = self.header.values.get(key)
        if value is None:
            return default
        if self.header.types[key] != ARRAY:
            return [self.u32(name)] * self.layers
        return [item & 0xFFFFFFFF for item in self._layer_array(key, value)]  # read unsigned

    def _layer_array(self, key: str, value: GGUFArray | Skipped) -> tuple[int, ...]:
        length = value.length if isinstance(value, Skipped) else len(value.items)
        if length != self.layers:
            raise _Refusal(
                f"{key} has {length} values; {self.key('block_count')} is {self.layers}, "
                "and llama.cpp wants one per layer"
            )
        item_type = value.value_type if isinstance(value, Skipped) else value.item_type
        if isinstance(value, Skipped) or item_type not in (_UINT32, _INT32, _BOOL):
            raise _Refusal(
                f"{key} is an array of {_type_name(item_type)}; "
                "llama.cpp reads per-layer counts as UINT32 or INT32"
            )
        return tuple(int(item) for item in value.items)

    def expect_type(self, key: str, wanted: int) -> None:
        actual = self.header.types[key]
        if actual != wanted:
            raise _Refusal(
                f"{key} is stored as {_type_name(actual)}; llama.cpp reads it only as "
                f"{_type_name(wanted)}"
            )

    @cached_property
    def layers(self) -> int:
        return self.u32("block_count")

    @cached_property
    def heads(self) -> list[int]:
        return self.per_layer("attention.head_count", [0] * self.layers)

    @cached_property
    def kv_heads(self) -> list[int]:
        return self.per_layer("attention.head_count_kv", self.heads)

    @cached_property
    def embedding(self) -> int:
        return self.u32("embedding_length")

    @cached_property
    def head_sizes(self) -> tuple[int, int]:
        """(key, value) head sizes as llama.cpp derives them from layer 0's head count."""
        heads = self.heads[0]
        default = self.embedding // heads if heads else 0
        key = self.u32("attention.key_length", default)
        return key, self.u32("attention.value_length", default)


def _type_name(value_type: int) -> str:
    return TYPE_NAMES.get(value_type, f"type {value_type}")


def _tensor(tensor: TensorInfo) -> str:
    return f"tensor {excerpt(tensor.name)}"


# --- the files: a split GGUF's parts --------------------------------------------------------

SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS = "split.no", "split.count", "split.tensors.count"


def _split_count_problem(first: GGUFHeader, names: Sequence[str]) -> str | None:
    """llama.cpp makes the other parts' names from the first one's and its split.count:
    a name that does not end in -00001-of-<split.count>.gguf is refused, and a file
    whose split.count is absent, 0 or 1 is loaded alone, whatever lies beside it."""
    count = _split_value(first, SPLIT_COUNT, _UINT16, names[0])
    parts, name = len(names), excerpt(names[0])
    said = count if count is not None and count > 1 else 1
    if said == parts:
        return None
    if parts == 1:
        return (
            f"{name} has {SPLIT_COUNT} {count}, but its name is not that of a split GGUF's "
            f"first part (NAME-00001-of-{said:05d}.gguf): llama.cpp refuses it"
        )
    found = f"no {SPLIT_COUNT}" if count is None else f"{SPLIT_COUNT} {count}"
    if said == 1:
        return (
            f"{name} is named part 1 of {parts} of a split GGUF, but has {found}: llama.cpp "
            f"would load it alone, without its {parts - 1} other part{'s' if parts > 2 else ''}"
        )
    return (
        f"{name} is named part 1 of {parts} of a split GGUF, but has {found}: llama.cpp "
        f"refuses a first part whose name does not end in -00001-of-{count:05d}.gguf"
    )


def _split_problem(parts: Sequence[GGUFHeader], names: Sequence[str]) -> str | None:
    """What llama.cpp checks as it opens the parts: the first one's split.count, each
    one's split.no (its index, from 0), and the first one's split.tensors.count."""
    problem = _split_count_problem(parts[0], names)
    if problem is not None or len(parts) == 1:
        return problem
    for index, (part, name) in enumerate(zip(parts, names, strict=True)):
        number = _split_value(part, SPLIT_NO, _UINT16, name)
        if number != index:
            found = f"no {SPLIT_NO}" if number is None else f"{SPLIT_NO} {number}"
            return (
                f"{excerpt(name)}, part {index + 1} of {len(parts)} of a split GGUF, has "
                f"{found}; llama.cpp wants {index} there (it counts the parts from 0)"
            )
    return _split_tensor_problem(parts, names)


def _split_tensor_problem(parts: Sequence[GGUFHeader], names: Sequence[str]) -> str | None:
    claimed = _split_value(parts[0], SPLIT_TENSORS, _INT32, names[0])
    total = sum(len(part.tensors) for part in parts)
    if claimed is None:
        return (
            f"{excerpt(names[0])} has no {SPLIT_TENSORS}, which llama.cpp requires of a "
            "split GGUF's first part"
        )
    if claimed != total:
        return (
            f"{SPLIT_TENSORS} is {claimed}, but the {len(parts)} parts hold {total} tensors "
            "in all: llama.cpp refuses the model as corrupted"
        )
    seen: dict[str, str] = {}
    for part, name in zip(parts, names, strict=True):
        for tensor in part.tensors:
            if tensor.name in seen:
                return (
                    f"{_tensor(tensor)} is in both {excerpt(seen[tensor.name])} and "
                    f"{excerpt(name)}; llama.cpp refuses a model with a tensor twice"
                )
            seen[tensor.name] = name
    return None


def _split_value(header: GGUFHeader, key: str, wanted: int, name: str) -> int | None:
    """A split key's value, None when absent; llama.cpp takes no other type than `wanted`."""
    if key not in header.values:
        return None
    if header.types[key] != wanted:
        raise _Refusal(
            f"{key} in {excerpt(name)} is stored as {_type_name(header.types[key])}; "
            f"llama.cpp reads it only as {_type_name(wanted)}"
        )
    value: int = header.values[key]
    return value


# --- each file: tensor infos and where their data lies -------------------------------------


def _layouts_problem(parts: Sequence[GGUFHeader], names: Sequence[str]) -> str | None:
    """Each file's tensor data against its own header and size: a part's offsets count
    from its own data section, and each part is mapped on its own."""
    for index, (part, name) in enumerate(zip(parts, names, strict=True)):
        problem = _layout_problem(part)
        if problem is not None:
            return problem if len(parts) == 1 else f"{excerpt(name)} (part {index + 1}): {problem}"
    return None


def _layout_problem(header: GGUFHeader) -> str | None:
    expected = 0
    for tensor in header.tensors:
        problem = _shape_of_data_problem(tensor)
        if problem is not None:
            return problem
        block = block_size(tensor.ggml_type)
        if not block:
            return None  # the type gate refuses it; nothing past it can be sized
        nbytes = tensor.n_elements // block * block_bytes(tensor.ggml_type)
        problem = _offset_problem(tensor, expected, nbytes, header)
        if problem is not None:
            return problem
        expected += nbytes + (-nbytes % header.alignment)
    return None


def _shape_of_data_problem(tensor: TensorInfo) -> str | None:
    if any(dim < 0 for dim in tensor.dims):
        return f"{_tensor(tensor)} has a negative dimension: {tensor.dims}"
    if 0 in tensor.dims:
        return f"{_tensor(tensor)} has a dimension of 0: {tensor.dims}"
    if tensor.n_elements > _INT64_MAX:
        return f"{_tensor(tensor)} has more elements than ggml can count: {tensor.dims}"
    block = block_size(tensor.ggml_type)
    row = tensor.dims[0] if tensor.dims else 1
    if block and row % block:
        return (
            f"{_tensor(tensor)} has {row} elements per row; its type "
            f"{type_name(tensor.ggml_type)} packs them in blocks of {block}"
        )
    return None


def _offset_problem(
    tensor: TensorInfo, expected: int, nbytes: int, header: GGUFHeader
) -> str | None:
    if tensor.offset != expected:
        return (
            f"the data of {_tensor(tensor)} starts at offset {tensor.offset} of the data "
            f"section; llama.cpp expects {expected} (each tensor's data follows the one "
            f"before, padded to {header.alignment} bytes)"
        )
    start = header.data_start + tensor.offset
    if start % TENSOR_ALIGNMENT:
        return (
            f"the data of {_tensor(tensor)} starts at byte {start} of the file, not a multiple "
            f"of {TENSOR_ALIGNMENT}: llama.cpp maps weights in place and ggml aborts on "
            f"unaligned ones (general.alignment is {header.alignment})"
        )
    end = start + nbytes
    if end > header.file_size:
        return (
            f"the data of {_tensor(tensor)} ends at byte {end}, past the end of the file "
            f"({header.file_size} bytes): the file is truncated"
        )
    return None


def _weight_type_problem(model: _Model) -> str | None:
    for tensor in model.header.tensors:
        if tensor.ggml_type in NOT_WEIGHT_TYPES:
            return (
                f"{_tensor(tensor)} is stored as {type_name(tensor.ggml_type)}; llama.cpp "
                "computes with float and quantized weights only (its matrix product crashes "
                "on this type)"
            )
        if tensor.ggml_type != _F32_TENSOR and _is_vector(tensor):
            return (
                f"{_tensor(tensor)} is a norm or a vector stored as "
                f"{type_name(tensor.ggml_type)}; llama.cpp multiplies and adds these in F32 "
                "only (its converter always writes them so) and aborts on other types"
            )
    return None


def _is_vector(tensor: TensorInfo) -> bool:
    """A norm's weights or a bias: one row, or a tensor named a norm."""
    return tensor.name.endswith("_norm.weight") or all(dim == 1 for dim in tensor.dims[1:])


# --- hyper-parameters ---------------------------------------------------------------------


def _architecture_problem(model: _Model) -> str | None:
    if not model.arch:
        return "the GGUF file names no general.architecture (a string)"
    return None


def _block_problem(model: _Model) -> str | None:
    layers, key = model.layers, model.key("block_count")
    if not 1 <= layers <= MAX_LAYERS:
        return f"{key} is {layers}; llama.cpp supports 1 to {MAX_LAYERS} layers"
    present: set[int] = set()
    for tensor in model.header.tensors:
        match = _BLOCK_INDEX.match(tensor.name)
        if match is None:
            continue
        index = int(match.group(1))
        if index >= layers:
            return (
                f"{_tensor(tensor)} belongs to block {index}, but {key} is {layers} "
                f"(blocks 0 to {layers - 1})"
            )
        present.add(index)
    missing = sorted(set(range(layers)) - present)
    if missing:
        return f"{key} is {layers}, but block {missing[0]} has no tensors (no blk.{missing[0]}.*)"
    nextn = model.u32("nextn_predict_layers", 0)
    if nextn > layers:
        return f"{model.key('nextn_predict_layers')} is {nextn}, more than {key} ({layers})"
    return None


def _expert_problem(model: _Model) -> str | None:
    experts = model.u32("expert_count", 0)
    used = max(model.per_layer("expert_used_count", [0]))
    if model.arch in _ONE_EXPERT_IS_DENSE and experts <= 1:
        experts = used = 0
    groups = model.u32("expert_group_count", 0)
    count, used_key = model.key("expert_count"), model.key("expert_used_count")
    if experts > MAX_EXPERTS:
        return f"{count} is {experts}; llama.cpp supports at most {MAX_EXPERTS} experts"
    if experts == 0:
        if used:
            return f"{used_key} is {used}, but the model has no experts ({count} is 0 or absent)"
        if groups:
            group_key = model.key("expert_group_count")
            return f"{group_key} is {groups}, but the model has no experts ({count} is 0 or absent)"
        return None
    if used == 0:
        return f"{count} is {experts}, but {used_key} is 0 or absent: no expert would run"
    if used > experts:
        return f"{used_key} is {used}, more than {count} ({experts})"
    return _expert_group_problem(model, experts, groups)


def _expert_group_problem(model: _Model, experts: int, groups: int) -> str | None:
    group_key = model.key("expert_group_count")
    if groups >= experts:
        return f"{group_key} is {groups}; it must be less than the {experts} experts"
    if groups <= 1:
        return None
    group_used = model.u32("expert_group_used_count", 0)
    if experts % groups:
        return f"{group_key} is {groups}, which does not divide the {experts} experts"
    if not 0 < group_used < groups:
        return (
            f"{model.key('expert_group_used_count')} is {group_used}; with {groups} expert "
            f"groups it must be between 1 and {groups - 1}"
        )
    return None


def _attention_problem(model: _Model) -> str | None:
    if model.embedding == 0:
        return f"{model.key('embedding_length')} is 0"
    if any(model.heads) and not any(model.kv_heads):
        return f"{model.key('attention.head_count_kv')} is 0 for every layer"
    for layer, (heads, kv_heads) in enumerate(zip(model.heads, model.kv_heads, strict=True)):
        if heads and kv_heads and heads % kv_heads:
            return (
                f"layer {layer} has {heads} attention heads and {kv_heads} KV heads; llama.cpp "
                "shares each KV head among a whole number of query heads"
            )
    return _head_size_problem(model)


def _head_size_problem(model: _Model) -> str | None:
    heads = model.heads[0]
    if not heads:
        return None
    for name in ("attention.key_length", "attention.value_length"):
        if not model.has(name) and model.embedding % heads:
            return (
                f"{model.key('embedding_length')} ({model.embedding}) is not a multiple of "
                f"{model.key('attention.head_count')} ({heads}), and no {model.key(name)} "
                "gives the head size"
            )
        if model.has(name) and model.u32(name) == 0:
            return f"{model.key(name)} is 0"
    return None


def _rope_problem(model: _Model) -> str | None:
    key = model.key("rope.scaling.type")
    if key in model.header.values:
        model.expect_type(key, STRING)
        value = model.header.values[key]
        if value not in ROPE_SCALING_TYPES:
            shown = excerpt(value) if isinstance(value, str) else f"a {value.length}-byte string"
            return f"{key} is {shown}; llama.cpp knows {', '.join(ROPE_SCALING_TYPES)}"
    if not model.has("rope.dimension_count") or not model.heads[0]:
        return None
    dims, head = model.u32("rope.dimension_count"), model.head_sizes[0]
    key = model.key("rope.dimension_count")
    if dims == 0 or dims % 2 or dims > head:
        return (
            f"{key} is {dims}; rotary embeddings turn pairs of values, so it must be even "
            f"and between 2 and the head size ({head})"
        )
    if model.arch in _ROPE_FILLS_HEAD and dims != head:
        return f"{key} is {dims}; llama.cpp's {model.arch} needs the head size ({head})"
    return None


def _norm_problem(model: _Model) -> str | None:
    prefix = model.key("")
    for key in model.header.values:
        if key.startswith(prefix) and key.endswith("epsilon"):
            value = model.f32(key)
            if not math.isfinite(value) or value < 0:
                return f"{key} is {value}; ggml's norms need a finite number >= 0"
    return None


def _context_problem(model: _Model) -> str | None:
    context = model.u32("context_length")
    if context > _INT32_MAX:
        return (
            f"{model.key('context_length')} is {context}; llama.cpp holds it in a signed "
            f"32-bit count (at most {_INT32_MAX})"
        )
    window = model.u32("attention.sliding_window", 0)
    if window > MAX_SLIDING_WINDOW:
        return (
            f"{model.key('attention.sliding_window')} is {window}; llama.cpp's 32-bit "
            f"arithmetic on token positions overflows past {MAX_SLIDING_WINDOW} and aborts "
            "(real models slide a few thousand tokens)"
        )
    return None


# --- tensor shapes against the hyper-parameters --------------------------------------------


def _vocabulary_problem(model: _Model) -> str | None:
    embeddings = _find(model.header, "token_embd.weight")
    if model.arch in _OWN_VOCABULARY_EXCEPTIONS or embeddings is None:
        return None
    tokens = model.header.values.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, Skipped) or tokens.value_type != STRING:
        return "the file has no vocabulary (tokenizer.ggml.tokens, an array of strings)"
    rows = embeddings.dims[1] if len(embeddings.dims) >= 2 else 1
    if rows != tokens.length:
        return (
            f"token_embd.weight has {rows} rows, but the vocabulary "
            f"(tokenizer.ggml.tokens) has {tokens.length} tokens"
        )
    return None


def _tokenizer_problem(model: _Model) -> str | None:
    values, key = model.header.values, "tokenizer.ggml.model"
    if key not in values:
        return f"the file has no {key}, which llama.cpp requires"
    model.expect_type(key, STRING)
    name = values[key]
    if name in _NO_VOCABULARY:
        return (
            f"{key} is {name!r}: the model has no vocabulary, so it can neither read a prompt "
            "nor write text (llama.cpp aborts when asked to)"
        )
    if name not in TOKENIZERS:
        shown = excerpt(name) if isinstance(name, str) else f"a {name.length}-byte string"
        return f"{key} is {shown}; llama.cpp knows {', '.join(TOKENIZERS)}"
    if model.header.duplicate_tokens is not None:
        first, second = model.header.duplicate_tokens
        return (
            f"tokens {first} and {second} of tokenizer.ggml.tokens are the same text; "
            "llama.cpp aborts on a vocabulary with duplicates"
        )
    return _added_token_problem(model)


def _added_token_problem(model: _Model) -> str | None:
    """A token llama.cpp is told to add to every prompt must exist: it aborts otherwise.

    A file that names none (or one outside the vocabulary) gets llama.cpp's default
    for its tokenizer, which some tokenizers do not have."""
    values = model.header.values
    tokens = values.get("tokenizer.ggml.tokens")
    size = tokens.length if isinstance(tokens, Skipped) else 0
    defaults = _DEFAULT_TOKEN_IDS.get(values["tokenizer.ggml.model"], (None, None, None))
    if values.get("tokenizer.ggml.pre") in _PRE_WITHOUT_BOS:
        defaults = (None, *defaults[1:])
    for (flag, id_key), default in zip(_ADDED_TOKENS, defaults, strict=True):
        if values.get(flag) is not True:
            continue
        token = default
        if id_key in values:
            model.expect_type(id_key, _UINT32)
            token = values[id_key] if values[id_key] < size else default
        if token is None or token >= size:
            return (
                f"{flag} is true, but {id_key} names no token of the {size}-token "
                "vocabulary and the tokenizer has no default: llama.cpp aborts when it adds it"
            )
    return None


def _missing_tensor_problem(model: _Model) -> str | None:
    """The tensors every layer of a plain transformer needs, in the architectures checked."""
    if model.arch not in STANDARD_SHAPES:
        return None
    names = {tensor.name for tensor in model.header.tensors}
    dense = model.u32("expert_count", 0) == 0
    for name in _required_tensors(model.layers, names, dense):
        if name not in names:
            return f"the file has no tensor {name}, which llama.cpp's {model.arch} needs"
    return None


def _required_tensors(layers: int, names: set[str], dense: bool) -> list[str]:
    required = ["token_embd.weight", "output_norm.weight"]
    for layer in range(layers):
        block = f"blk.{layer}."
        roles = ["attn_norm", "attn_output", "ffn_norm"]
        if block + "attn_qkv.weight" not in names:
            roles += ["attn_q", "attn_k", "attn_v"]
        if dense:
            roles += ["ffn_up", "ffn_down"]
        required += [f"{block}{role}.weight" for role in roles]
    return required


def _shape_problem(model: _Model) -> str | None:
    if model.arch not in STANDARD_SHAPES or model.has("attention.key_length_swa"):
        return None
    if not all(model.heads):
        return f"{model.key('attention.head_count')} is 0 (or absent) for some layer"
    expected = _expected_shapes(model)
    for tensor in model.header.tensors:
        wanted = expected.get(tensor.name)
        if wanted is not None and _squeezed(tensor.dims, len(wanted)) != wanted:
            return (
                f"{_tensor(tensor)} has shape {tensor.dims}; the hyper-parameters make it "
                f"{wanted} ({_explained(model)})"
            )
    return None


def _expected_shapes(model: _Model) -> dict[str, tuple[int, ...]]:
    embedding, (key, value) = model.embedding, model.head_sizes
    ffn = model.per_layer("feed_forward_length", [0] * model.layers)
    shapes: dict[str, tuple[int, ...]] = {"output_norm.weight": (embedding,)}
    for layer in range(model.layers):
        heads, kv_heads, width = model.heads[layer], model.kv_heads[layer], ffn[layer]
        per_layer = {
            "attn_norm": (embedding,),
            "attn_q": (embedding, key * heads),
            "attn_k": (embedding, key * kv_heads),
            "attn_v": (embedding, value * kv_heads),
            "attn_output": (key * heads, embedding),
            "ffn_norm": (embedding,),
            "ffn_gate": (embedding, width),
            "ffn_up": (embedding, width),
            "ffn_down": (width, embedding),
        }
        shapes.update({f"blk.{layer}.{name}.weight": dims for name, dims in per_layer.items()})
    embeddings = _find(model.header, "token_embd.weight")
    if embeddings is not None and len(embeddings.dims) >= 2:
        shapes["token_embd.weight"] = (embedding, embeddings.dims[1])
        shapes["output.weight"] = (embedding, embeddings.dims[1])
    return shapes


def _squeezed(dims: tuple[int, ...], length: int) -> tuple[int, ...]:
    """The shape without trailing 1s past `length` dimensions (ggml ignores them)."""
    while len(dims) > length and dims[-1] == 1:
        dims = dims[:-1]
    return dims


def _explained(model: _Model) -> str:
    key, value = model.head_sizes
    return (
        f"embedding_length {model.embedding}, head_count {model.heads[0]}, "
        f"head_count_kv {model.kv_heads[0]}, head size {key}/{value}"
    )


def _find(header: GGUFHeader, name: str) -> TensorInfo | None:
    return next((t for t in header.tensors if t.name == name), None)


_CHECKS: tuple[Callable[[_Model], str | None], ...] = (
    _weight_type_problem,
    _architecture_problem,
    _block_problem,
    _expert_problem,
    _attention_problem,
    _rope_problem,
    _norm_problem,
    _context_problem,
    _vocabulary_problem,
    _tokenizer_problem,
    _missing_tensor_problem,
    _shape_problem,
)
