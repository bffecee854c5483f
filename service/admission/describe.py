"""What a checkpoint is, read from its metadata alone (never its weights).

A GGUF file's header (key-values and tensor infos; the weights stay on disk,
memory-mapped and untouched) or a checkpoint directory's config.json and file
sizes give the architecture, the quantization, the size of the weights and
the KV cache a token costs.

A model whose metadata is broken is the caller's bad model, not a failed
request: metadata that cannot be read at all raises `UnreadableModel`, and
metadata that reads but is inconsistent (a GGUF block count of 600, a
config.json with num_hidden_layers "abc") gives a description whose `defect`
says what is wrong. Admission turns both into a refusal with that reason.
Both are cached by path, size and modification time, so asking again about
the same broken file costs nothing.

A split GGUF (NAME-00001-of-0000N.gguf and its parts beside it) is described
from every part's header, as llama.cpp loads it: local files and a hub repo's
alike go through `describe_gguf_parts`.
"""

from __future__ import annotations

import bisect
import errno
import io
import json
import os
import re
import stat
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, BinaryIO

import gguf

from service.admission.ggml_types import block_size, type_name
from service.admission.gguf_checks import gguf_problem, split_count_problem
from service.admission.gguf_header import (
    VOCABULARY,
    GGUFArray,
    GGUFFormatError,
    GGUFHeader,
    Skipped,
    join_parts,
    read_gguf_header_from,
)
from service.admission.quantization import (
    Quantization,
    from_checkpoint_config,
    from_gguf_type_name,
)
from service.errors import excerpt
from service.hub.budget import CONFIG_CONTAINERS
from service.hub.files import SPLIT_GGUF
from service.hub.seekable import SeekableReader
from service.memory import cells_per_sequence

KV_BYTES_PER_VALUE = 2  # f16 K and V caches, the default of both backends
# config.json and model_index.json are a few KB; a larger one is not a config.
MAX_JSON_BYTES = 4 << 20
# Items (array elements and object members, every level) a config may hold; with at
# most CONFIG_CONTAINERS objects and arrays (service.hub.budget), parsing one costs at
# most some 25 MB whatever its shape (a 4 MiB config of 5-byte strings was 1.3 M items,
# 73 MB parsed). Real configs hold a few hundred; a label map of 21,843 ImageNet
# classes each way, some 44,000.
CONFIG_ITEMS = 1 << 17
# A JSON string, escapes and all: what is taken out before counting exactly.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')


class UnreadableModel(Exception):
    """The model's metadata cannot be read at all; the message says why."""


def cannot_read(exc: OSError, path: Path | str, which: str) -> UnreadableModel:
    """Why `which` (the model file, config.json...) at `path` cannot be read. A file this
    server's user may not read is named, with what to do: it is the operator's to fix.
    By its name only, as every message names a model's files: the server's full paths
    are not a client's to see (the model's name, beside it in the reply, finds it)."""
    if exc.errno in (errno.EACCES, errno.EPERM):
        name = Path(exc.filename or path).name
        return UnreadableModel(
            f"cannot read {excerpt(name)}: permission denied; make it readable by "
            f"this server's user (uid {os.getuid()}, gid {os.getgid()}): chmod a+r it, or "
            "give it that group (in Kubernetes, the pod's securityContext.fsGroup)"
        )
    return UnreadableModel(f"{which} cannot be read: {exc.strerror or exc}")


@dataclass(frozen=True)
class ModelDescription:
    format: str  # "gguf" or "safetensors"
    architecture: str
    quantization: Quantization
    weights_bytes: int
    kv_bytes_per_token: int
    trained_context: int
    # Repeating layers (blocks): the unit llama.cpp offloads to a GPU; 0 when unknown.
    layer_count: int = 0
    # Tokens in the vocabulary (GGUF only; 0 when unknown): each step's logits rows.
    vocab_size: int = 0
    # GGUF only: the ggml type id of every tensor, for the decodability gate.
    tensor_types: frozenset[int] = frozenset()
    # safetensors only: config.json's model_type and architectures, for the backend's
    # own registry (`_kept`: not the whole document, which descriptions would keep).
    config: Mapping[str, Any] = field(default_factory=dict)
    # What is wrong with the metadata, in words; empty when nothing is.
    defect: str = ""
    # GGUF only: how the model pools its token vectors into one ("mean", "cls",
    # "last"), from `{arch}.pooling_type`; set only for an embedding model.
    pooling: str = ""

    def memory_bytes(
        self, context_size: int, sequences: int = 1, *, pooled: bool = False
    ) -> tuple[int, int]:
        """(weights, KV cache) bytes when loaded with `context_size` tokens of context:
        one sequence's window, capped by the trained one; with `sequences`, a window
        for each sequence; `pooled`, one pool of cells that every sequence shares,
        which the trained window does not cap (it caps each sequence in it)."""
        window = min(context_size, self.trained_context) if self.trained_context else context_size
        if pooled:
            cells = context_size
        elif sequences > 1:
            cells = cells_per_sequence(window) * sequences
        else:
            cells = window
        return self.weights_bytes, self.kv_bytes_per_token * cells

    def compute_bytes(self, batch_size: int) -> int:
        """llama.cpp's compute buffer for steps of `batch_size` tokens: it reserves a
        logits row (4 bytes per vocabulary entry) for every token of a step, which is
        nearly all of it (512 of 514.5 MiB for Gemma 3 270M at 512 tokens)."""
        return 4 * self.vocab_size * batch_size


# A file as the cache knows it: its path, size and modification time.
_Stamp = tuple[Path, int, int]


def describe_gguf(path: Path) -> ModelDescription:
    """A GGUF file's description; for the first part of a split GGUF, the whole model's,
    from every part's header (llama.cpp opens the other parts beside the first)."""
    paths = gguf_files(path)
    try:
        result = _describe_gguf_cached(tuple(_stamp(paths, index) for index in range(len(paths))))
    except OSError as exc:  # not cached: it may be gone by the next call
        index = next((i for i, part in enumerate(paths) if str(part) == exc.filename), 0)
        which = _which([part.name for part in paths], index, "the model file")
        raise cannot_read(exc, paths[index], which) from exc
    if isinstance(result, str):
        raise UnreadableModel(result)
    return result


def gguf_files(path: Path) -> list[Path]:
    """The files llama.cpp opens for a GGUF: itself, or every part of a split one when
    `path` names its first part. A later part is refused, as llama.cpp refuses it."""
    match = SPLIT_GGUF.match(path.name)
    if match is None or match["count"] == "00000":
        return [path]
    count = int(match["count"])
    names = [f"{match['prefix']}-{part:05d}-of-{count:05d}.gguf" for part in range(1, count + 1)]
    if path.name != names[0]:
        raise UnreadableModel(
            f"{excerpt(path.name)} is not the first part of a split GGUF: llama.cpp loads "
            f"one from its first part, {excerpt(names[0])}"
        )
    return [path.with_name(name) for name in names]


def _stamp(paths: Sequence[Path], index: int) -> _Stamp:
    """The cache's key for one file: a missing part is an OSError, named by the caller."""
    status = paths[index].stat()
    if not stat.S_ISREG(status.st_mode):  # a FIFO would block the read for ever
        which = _which([part.name for part in paths], index, "the model")
        raise UnreadableModel(f"{which} is not a regular file")
    return paths[index], status.st_size, status.st_mtime_ns


def _which(names: Sequence[str], index: int, single: str) -> str:
    """A file in a message: `single` for a whole model, else the part, by name."""
    if len(names) == 1:
        return single
    return f"{excerpt(names[index])} (part {index + 1} of {len(names)} of a split GGUF)"


@lru_cache(maxsize=64)
def _describe_gguf_cached(files: tuple[_Stamp, ...]) -> ModelDescription | str:
    """The description, or why a header cannot be read; both are cached, keyed by every
    file's path, size and modification time. An OSError is not cached."""
    names = [path.name for path, _, _ in files]
    try:
        return describe_gguf_parts(names, lambda index: _read_local(files[index][0], names, index))
    except UnreadableModel as exc:
        return str(exc)


def _read_local(path: Path, names: Sequence[str], index: int) -> GGUFHeader:
    with path.open("rb", buffering=1 << 16) as file:
        return read_gguf_part(file, os.fstat(file.fileno()).st_size, names, index)


def describe_joined_gguf(chunks: Sequence[Path], name: str) -> ModelDescription:
    """A GGUF file shipped in chunks that are joined only to load it (an embedded model's),
    described from the chunks read as one file named `name`: nothing is written (the
    header is in the first chunk; the others give their sizes). Cached as describe_gguf."""
    try:
        result = _describe_joined_cached(name, tuple(_stamp(chunks, i) for i in range(len(chunks))))
    except OSError as exc:
        raise cannot_read(exc, exc.filename or chunks[0], "a chunk of the model file") from exc
    if isinstance(result, str):
        raise UnreadableModel(result)
    return result


@lru_cache(maxsize=8)
def _describe_joined_cached(name: str, files: tuple[_Stamp, ...]) -> ModelDescription | str:
    try:
        with io.BufferedReader(_Joined([path for path, _, _ in files]), 1 << 16) as joined:
            size = joined.raw.size
            return describe_gguf_parts([name], lambda _: read_gguf_part(joined, size, [name], 0))
    except UnreadableModel as exc:
        return str(exc)


class _Joined(SeekableReader):
    """Files read as one, in order, without joining them: read-only, seekable."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self._files: list[BinaryIO] = []
        try:
            for path in paths:
                self._files.append(path.open("rb", buffering=0))
        except OSError:
            self.close()
            raise
        sizes = [os.fstat(file.fileno()).st_size for file in self._files]
        self._starts = [sum(sizes[:index]) for index in range(len(sizes))]
        self._ends = [start + size for start, size in zip(self._starts, sizes, strict=True)]
        super().__init__(sum(sizes))

    def _read_at(self, position: int, into: memoryview) -> int:
        index = bisect.bisect_right(self._starts, position) - 1
        file = self._files[index]
        file.seek(position - self._starts[index])
        want = min(len(into), self._ends[index] - position)
        # 0 (a short read) when a chunk shrank while being read
        return file.readinto(into[:want]) or 0  # type: ignore[attr-defined]

    def close(self) -> None:
        for file in self._files:
            file.close()
        super().close()


def describe_gguf_parts(
    names: Sequence[str], read: Callable[[int], GGUFHeader]
) -> ModelDescription:
    """A GGUF model's description from the headers of its files, `read(index)` giving
    that of `names[index]`: one file, or every part of a split one, first part first.
    The first part's split.count is checked against the names before another part is
    read, so a file that lies about its parts costs one header, not thousands."""
    if not names:  # a name ending in -of-00000.gguf
        raise UnreadableModel("a split GGUF's name says it has 0 parts")
    first = read(0)
    problem = split_count_problem(first, names)
    if problem is not None:
        return _describe_header(first, problem)
    parts = [first, *(read(index) for index in range(1, len(names)))]
    return _describe_header(join_parts(parts), gguf_problem(parts, names))


def read_gguf_part(file: BinaryIO, size: int, names: Sequence[str], index: int) -> GGUFHeader:
    """The header of `names[index]` from an open file of `size` bytes (a local file, or
    a hub file read by ranges); UnreadableModel, naming the part, when it is broken."""
    try:
        return read_gguf_header_from(file, size)
    except GGUFFormatError as exc:
        which = "" if len(names) == 1 else f"{_which(names, index, '')} is "
        raise UnreadableModel(f"{which}not a readable GGUF file: {exc}") from exc


def _describe_header(header: GGUFHeader, problem: str | None) -> ModelDescription:
    values = header.values
    arch = values.get("general.architecture")
    arch = arch if isinstance(arch, str) else ""
    counts: Counter[int] = Counter()
    for tensor in header.tensors:
        counts[tensor.ggml_type] += tensor.n_elements
    return ModelDescription(
        format="gguf",
        architecture=_bounded(arch, NAME_CHARACTERS),
        quantization=_gguf_quantization(values, counts),
        weights_bytes=header.file_size,
        kv_bytes_per_token=_gguf_kv_bytes_per_token(values, arch),
        trained_context=_count(values.get(f"{arch}.context_length")),
        layer_count=_count(values.get(f"{arch}.block_count")),
        vocab_size=_vocabulary_size(values.get(VOCABULARY)),
        tensor_types=frozenset(counts),
        defect=_bounded(problem or "", DEFECT_CHARACTERS),
        pooling=_POOLING.get(_count(values.get(f"{arch}.pooling_type")), ""),
    )


# llama.cpp's pooling types (llama.h's llama_pooling_type) that give one vector per input.
_POOLING = {1: "mean", 2: "cls", 3: "last"}


def _vocabulary_size(tokens: Any) -> int:
    """The vocabulary's length: the header reader skips the token strings, keeping it."""
    return tokens.length if isinstance(tokens, Skipped) else 0


def _count(value: Any, default: int = 0) -> int:
    """A count from metadata: a whole number, the largest of a per-layer array, else default."""
    if isinstance(value, GGUFArray):
        value = max(value.items, default=default)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return default


def _gguf_quantization(values: Mapping[str, Any], counts: Counter[int]) -> Quantization:
    """From the file type the converter recorded, else from the most common tensor type."""
    file_type = values.get("general.file_type")
    if isinstance(file_type, int) and file_type in _FILE_TYPE_NAMES:
        name = _FILE_TYPE_NAMES[file_type]
        return from_gguf_type_name(name, _block_size(_base_type(name)))
    quantized = [t for t in counts if t not in _FLOAT_TYPES] or list(counts)
    if not quantized:
        return from_gguf_type_name("F32")
    dominant = max(quantized, key=lambda t: counts[t])
    # ggml, not the gguf package, knows every type this build reads.
    return from_gguf_type_name(type_name(dominant).upper(), block_size(dominant))


def _base_type(file_type_name: str) -> gguf.GGMLQuantizationType | None:
    """The tensor type a file type is built on: Q4_K_M -> Q4_K, MXFP4_MOE -> MXFP4."""
    name = file_type_name
    while name:
        if name in gguf.GGMLQuantizationType.__members__:
            return gguf.GGMLQuantizationType[name]
        name = name.rpartition("_")[0]
    return None


def _block_size(ggml_type: gguf.GGMLQuantizationType | None) -> int:
    if ggml_type is None or ggml_type in _FLOAT_TYPES:
        return 0
    return int(gguf.GGML_QUANT_SIZES[ggml_type][0])


_FLOAT_TYPES = {
    gguf.GGMLQuantizationType.F32,
    gguf.GGMLQuantizationType.F16,
    gguf.GGMLQuantizationType.BF16,
}
_FILE_TYPE_NAMES = {
    int(t): t.name.removeprefix("MOSTLY_").removeprefix("ALL_")
    for t in gguf.LlamaFileType
    if t is not gguf.LlamaFileType.GUESSED
}


def _gguf_kv_bytes_per_token(values: Mapping[str, Any], arch: str) -> int:
    layers = _count(values.get(f"{arch}.block_count"))
    heads = _count(values.get(f"{arch}.attention.head_count"))
    # Some architectures give a per-layer list of KV head counts: the largest counts.
    kv_heads = _count(values.get(f"{arch}.attention.head_count_kv"), heads)
    width = _count(values.get(f"{arch}.embedding_length"))
    default_head = width // heads if heads else 0
    key = _count(values.get(f"{arch}.attention.key_length"), default_head)
    value = _count(values.get(f"{arch}.attention.value_length"), default_head)
    return layers * kv_heads * (key + value) * KV_BYTES_PER_VALUE


def describe_checkpoint(directory: Path) -> ModelDescription:
    return checkpoint_description(
        read_config(directory), _total_size(directory.glob("*.safetensors"))
    )


def checkpoint_description(config: dict[str, Any], weights: int) -> ModelDescription:
    """A checkpoint's description from its config.json and its safetensors' bytes."""
    text_config = config.get("text_config")
    text = text_config if isinstance(text_config, Mapping) else config
    model_type = config.get("model_type")
    return ModelDescription(
        format="safetensors",
        architecture=_bounded(model_type if isinstance(model_type, str) else "", NAME_CHARACTERS),
        quantization=from_checkpoint_config(config),
        weights_bytes=weights,
        kv_bytes_per_token=_config_kv_bytes_per_token(text),
        trained_context=_count(text.get("max_position_embeddings")),
        config=_kept(config),
        defect=_bounded(_config_problem(config, text) or "", DEFECT_CHARACTERS),
    )


# What admission reads of a config after describing it: mlx-lm's registry is keyed by
# these two. The rest of the parsed document is not kept (descriptions are remembered:
# a 4 MiB config of `{}` items kept whole cost 97 MB each).
_KEPT_KEYS = ("model_type", "architectures")
_KEPT_ARCHITECTURES = 16
_KEPT_CHARACTERS = 256
# A description's names (architecture, pipeline class) and its defect, at most: every
# string a description holds is bounded, so one remembered costs a few KB whatever the
# metadata said (GGUF strings are cut at gguf_header.KEPT_STRING_BYTES already).
NAME_CHARACTERS = _KEPT_CHARACTERS
DEFECT_CHARACTERS = 1_024


def _bounded(text: str, limit: int) -> str:
    """`text` cut to `limit` characters (a defect's cut is marked)."""
    if len(text) <= limit:
        return text
    return text[: limit - 3] + "..."


def _kept(config: Mapping[str, Any]) -> dict[str, Any]:
    """The few fields of a config admission needs later, each bounded: at most
    `_KEPT_ARCHITECTURES` names of `_KEPT_CHARACTERS` characters."""
    kept: dict[str, Any] = {}
    for key in _KEPT_KEYS:
        value = config.get(key)
        if isinstance(value, str):
            kept[key] = value[:_KEPT_CHARACTERS]
        elif isinstance(value, list):
            names = [item[:_KEPT_CHARACTERS] for item in value if isinstance(item, str)]
            kept[key] = names[:_KEPT_ARCHITECTURES]
    return kept


# Sizes a config.json states, each a whole number >= 0 when present.
_CONFIG_COUNTS = (
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "hidden_size",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "max_position_embeddings",
)
# A model_type names a Python module of the backend (mlx_lm.models.<model_type>).
_MODULE_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _config_problem(config: Mapping[str, Any], text: Mapping[str, Any]) -> str | None:
    """What in a checkpoint's config.json no loader could use, in words; None if nothing."""
    model_type = config.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        return f"config.json's model_type is {_shown(model_type)}; it must be a string"
    if model_type and not _MODULE_NAME.fullmatch(model_type):
        return (
            f"config.json's model_type {excerpt(model_type)} is not a name a model module "
            "could have (letters, digits, '_' and '-')"
        )
    if "text_config" in config and not isinstance(config["text_config"], Mapping):
        return f"config.json's text_config is {_shown(config['text_config'])}; it must be an object"
    architectures = config.get("architectures")
    if architectures is not None and not _strings(architectures):
        return f"config.json's architectures is {_shown(architectures)}; it must list names"
    for key in _CONFIG_COUNTS:
        value = text.get(key)
        if value is not None and _count(value, -1) < 0:
            return f"config.json's {key} is {_shown(value)}; it must be a whole number >= 0"
    return None


def _strings(value: Any) -> bool:
    return isinstance(value, str) or (
        isinstance(value, list) and all(isinstance(item, str) for item in value)
    )


def _shown(value: Any) -> str:
    """A JSON value for a message: its JSON text (cut short when long), and its kind."""
    text = json.dumps(value)  # escapes control characters: safe in a log line
    kind = _JSON_KINDS.get(type(value), "value")
    return f"{text if len(text) <= 64 else excerpt(text)} (a JSON {kind})"


_JSON_KINDS = {
    str: "string",
    int: "number",
    float: "number",
    bool: "boolean",
    list: "array",
    dict: "object",
    type(None): "null",
}


def describe_pipeline(directory: Path) -> ModelDescription:
    """A diffusers pipeline directory: its class and the size and dtype of its weights."""
    index = _read_json(directory / "model_index.json")
    weights = [f for f in directory.rglob("*") if f.suffix in (".safetensors", ".bin")]
    dtype = next((d for f in weights if (d := _safetensors_dtype(f))), "float32")
    return pipeline_description(index, _total_size(weights), dtype)


def pipeline_description(index: dict[str, Any], weights: int, dtype: str) -> ModelDescription:
    """A pipeline's description from its model_index.json, weight bytes and dtype."""
    class_name = index.get("_class_name", "")
    defect = ""
    if not isinstance(class_name, str):
        defect = f"model_index.json's _class_name is {_shown(class_name)}; it must be a string"
        class_name = ""
    elif len(class_name) > NAME_CHARACTERS:
        defect = (
            f"model_index.json's _class_name is {len(class_name)} characters long; no "
            f"pipeline class's name is longer than {NAME_CHARACTERS}"
        )
        class_name = class_name[:NAME_CHARACTERS]
    return ModelDescription(
        format="diffusers",
        architecture=class_name,
        quantization=from_checkpoint_config({"torch_dtype": dtype}),
        weights_bytes=weights,
        kv_bytes_per_token=0,
        trained_context=0,
        config=_kept(index),
        defect=_bounded(defect, DEFECT_CHARACTERS),
    )


def _total_size(files: Iterable[Path]) -> int:
    """The files' bytes in all; a file that cannot be read (a dangling link) is a refusal."""
    total = 0
    for file in files:
        try:
            total += file.stat().st_size
            if not os.access(file, os.R_OK):  # stat needs no permission to read it
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(file))
        except OSError as exc:
            raise cannot_read(exc, file, excerpt(file.name)) from exc
    return total


_SAFETENSORS_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}


def _safetensors_dtype(path: Path) -> str | None:
    """The dtype of the first floating tensor, from the file's JSON header alone."""
    if path.suffix != ".safetensors":
        return None
    try:
        with path.open("rb") as file:
            return safetensors_dtype_from(file)
    except OSError:
        return None


def safetensors_dtype_from(file: BinaryIO) -> str | None:
    """The dtype of the first floating tensor of an open safetensors file (its header
    alone: 8 bytes of length, then that much JSON, at most 16 MiB)."""
    try:
        length = int.from_bytes(file.read(8), "little")
        header = json.loads(file.read(min(length, 1 << 24)))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(header, dict):
        return None
    for name, info in header.items():
        dtype = info.get("dtype") if isinstance(info, dict) else None
        if name != "__metadata__" and isinstance(dtype, str) and dtype in _SAFETENSORS_DTYPES:
            return _SAFETENSORS_DTYPES[dtype]
    return None


def read_config(directory: Path) -> dict[str, Any]:
    return _read_json(directory / "config.json")


def _read_json(path: Path) -> dict[str, Any]:
    """A JSON object from a small file, or UnreadableModel saying what is wrong.

    Messages name the file, not its directory: that is the client's model name,
    which the reply already carries."""
    try:
        size = path.stat().st_size
        text = path.read_bytes() if size <= MAX_JSON_BYTES else b""
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EPERM):
            raise cannot_read(exc, path, path.name) from exc
        raise UnreadableModel(f"the model has no readable {path.name}: {exc.strerror}") from exc
    return json_object(text, path.name, size)


def json_object(text: bytes, name: str, size: int) -> dict[str, Any]:
    """The JSON object in a config file's bytes (`size` in all; over MAX_JSON_BYTES is
    refused unread), or UnreadableModel saying what is wrong, naming the file."""
    if size > MAX_JSON_BYTES:
        raise UnreadableModel(f"{name} is {size} bytes; a config is at most {MAX_JSON_BYTES}")
    containers, items = json_counts(text, CONFIG_CONTAINERS, CONFIG_ITEMS)
    if containers > CONFIG_CONTAINERS:
        raise UnreadableModel(
            f"{name} holds more than {CONFIG_CONTAINERS} JSON objects and arrays; no config "
            "needs that many"
        )
    if items > CONFIG_ITEMS:
        raise UnreadableModel(
            f"{name} holds more than {CONFIG_ITEMS} JSON values in its objects and arrays; "
            "no config needs that many"
        )
    try:
        data = json.loads(text)
    except RecursionError as exc:
        raise UnreadableModel(f"{name} nests its values too deeply to read") from exc
    except ValueError as exc:  # JSONDecodeError, or bytes that are not UTF-8
        raise UnreadableModel(f"{name} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise UnreadableModel(f"{name} is not a JSON object")
    return data


def json_counts(raw: bytes, containers: int, items: int) -> tuple[int, int]:
    """How many objects and arrays, and items in them, the JSON `raw` holds, counted
    without parsing it: brackets and commas at C speed, an upper bound. When that is
    past `containers` or `items`, the brackets and commas inside strings (text) are
    taken off, string by string, which makes it exact for valid JSON; a string is at
    most two items' worth (a member's key and value), so past `2 * items + 1` strings
    the count stops there, over the budget, having allocated nothing that stays."""
    found = _rough_counts(raw, 0, len(raw))
    if found[0] <= containers and found[1] <= items:
        return found
    inside = [0, 0]
    for number, string in enumerate(_JSON_STRING.finditer(raw)):
        if number > 2 * items + 1:
            return found[0] - inside[0], items + 1
        in_string = _rough_counts(raw, *string.span())
        inside = [inside[0] + in_string[0], inside[1] + in_string[1]]
    return found[0] - inside[0], found[1] - inside[1]


def _rough_counts(raw: bytes, start: int, end: int) -> tuple[int, int]:
    """Brackets, and commas plus brackets, in raw[start:end]: every item but a
    container's first follows a comma."""
    containers = raw.count(b"{", start, end) + raw.count(b"[", start, end)
    return containers, raw.count(b",", start, end) + containers


def _config_kv_bytes_per_token(config: Mapping[str, Any]) -> int:
    layers = _count(config.get("num_hidden_layers"))
    heads = _count(config.get("num_attention_heads"))
    kv_heads = _count(config.get("num_key_value_heads")) or heads
    hidden = _count(config.get("hidden_size"))
    head_dim = _count(config.get("head_dim")) or (hidden // heads if heads else 0)
    return layers * kv_heads * 2 * head_dim * KV_BYTES_PER_VALUE
