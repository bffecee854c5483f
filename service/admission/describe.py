"""What a checkpoint is, read from its metadata alone (never its weights).

A GGUF file's header (key-values and tensor infos; the weights stay on disk,
memory-mapped and untouched) or a checkpoint directory's config.json and file
sizes give the architecture, the quantization, the size of the weights and
the KV cache a token costs.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import gguf

from service.admission.gguf_header import GGUFFormatError, read_gguf_header
from service.admission.quantization import (
    Quantization,
    from_checkpoint_config,
    from_gguf_type_name,
)
from service.errors import InvalidRequest
from service.models.memory import cells_per_sequence

KV_BYTES_PER_VALUE = 2  # f16 K and V caches, the default of both backends


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
    # GGUF only: the ggml type id of every tensor, for the decodability gate.
    tensor_types: frozenset[int] = frozenset()
    # safetensors only: the parsed config.json, for the backend's own registry.
    config: Mapping[str, Any] = field(default_factory=dict)

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


def describe_gguf(path: Path) -> ModelDescription:
    stat = path.stat()
    return _describe_gguf_cached(path, stat.st_size, stat.st_mtime_ns)


@lru_cache(maxsize=64)
def _describe_gguf_cached(path: Path, size: int, mtime_ns: int) -> ModelDescription:
    try:
        header = read_gguf_header(path)
    except (GGUFFormatError, OSError) as exc:
        raise InvalidRequest(f"{path.name} is not a readable GGUF file: {exc}") from exc
    values = header.values
    arch = str(values.get("general.architecture", ""))
    counts: Counter[int] = Counter()
    for tensor in header.tensors:
        counts[tensor.ggml_type] += tensor.n_elements
    return ModelDescription(
        format="gguf",
        architecture=arch,
        quantization=_gguf_quantization(values, counts),
        weights_bytes=size,
        kv_bytes_per_token=_gguf_kv_bytes_per_token(values, arch),
        trained_context=int(values.get(f"{arch}.context_length", 0)),
        layer_count=int(values.get(f"{arch}.block_count", 0)),
        tensor_types=frozenset(counts),
    )


def _gguf_quantization(values: Mapping[str, Any], counts: Counter[int]) -> Quantization:
    """From the file type the converter recorded, else from the most common tensor type."""
    file_type = values.get("general.file_type")
    if isinstance(file_type, int) and file_type in _FILE_TYPE_NAMES:
        name = _FILE_TYPE_NAMES[file_type]
        return from_gguf_type_name(name, _block_size(_base_type(name)))
    quantized = [t for t in counts if t not in _FLOAT_TYPES] or list(counts)
    if not quantized:
        return from_gguf_type_name("F32")
    dominant = gguf.GGMLQuantizationType(max(quantized, key=lambda t: counts[t]))
    return from_gguf_type_name(dominant.name, _block_size(dominant))


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
    layers = int(values.get(f"{arch}.block_count", 0))
    heads = int(values.get(f"{arch}.attention.head_count", 0) or 0)
    kv_heads_value = values.get(f"{arch}.attention.head_count_kv", heads)
    # Some architectures give a per-layer list of KV head counts.
    kv_heads = max(kv_heads_value) if isinstance(kv_heads_value, list) else int(kv_heads_value)
    width = int(values.get(f"{arch}.embedding_length", 0))
    default_head = width // heads if heads else 0
    key = int(values.get(f"{arch}.attention.key_length", default_head))
    value = int(values.get(f"{arch}.attention.value_length", default_head))
    return layers * kv_heads * (key + value) * KV_BYTES_PER_VALUE


def describe_checkpoint(directory: Path) -> ModelDescription:
    config = read_config(directory)
    text = config.get("text_config") if isinstance(config.get("text_config"), Mapping) else config
    assert isinstance(text, Mapping)
    weights = sum(f.stat().st_size for f in directory.glob("*.safetensors"))
    return ModelDescription(
        format="safetensors",
        architecture=str(config.get("model_type", "")),
        quantization=from_checkpoint_config(config),
        weights_bytes=weights,
        kv_bytes_per_token=_config_kv_bytes_per_token(text),
        trained_context=int(text.get("max_position_embeddings") or 0),
        config=config,
    )


def describe_pipeline(directory: Path) -> ModelDescription:
    """A diffusers pipeline directory: its class and the size and dtype of its weights."""
    index = _read_json(directory / "model_index.json", directory.name)
    weights = [f for f in directory.rglob("*") if f.suffix in (".safetensors", ".bin")]
    dtype = next((d for f in weights if (d := _safetensors_dtype(f))), "float32")
    return ModelDescription(
        format="diffusers",
        architecture=str(index.get("_class_name", "")),
        quantization=from_checkpoint_config({"torch_dtype": dtype}),
        weights_bytes=sum(f.stat().st_size for f in weights),
        kv_bytes_per_token=0,
        trained_context=0,
        config=index,
    )


_SAFETENSORS_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}


def _safetensors_dtype(path: Path) -> str | None:
    """The dtype of the first floating tensor, from the file's JSON header alone."""
    if path.suffix != ".safetensors":
        return None
    try:
        with path.open("rb") as file:
            length = int.from_bytes(file.read(8), "little")
            header = json.loads(file.read(min(length, 1 << 24)))
    except (OSError, ValueError):
        return None
    for name, info in header.items():
        if name != "__metadata__" and info.get("dtype") in _SAFETENSORS_DTYPES:
            return _SAFETENSORS_DTYPES[info["dtype"]]
    return None


def read_config(directory: Path) -> dict[str, Any]:
    return _read_json(directory / "config.json", directory.name)


def _read_json(path: Path, label: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise InvalidRequest(f"{label} has no readable {path.name}: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"{label}/{path.name} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise InvalidRequest(f"{label}/{path.name} is not a JSON object")
    return data


def _config_kv_bytes_per_token(config: Mapping[str, Any]) -> int:
    layers = int(config.get("num_hidden_layers") or 0)
    heads = int(config.get("num_attention_heads") or 0)
    kv_heads = int(config.get("num_key_value_heads") or heads)
    hidden = int(config.get("hidden_size") or 0)
    head_dim = int(config.get("head_dim") or (hidden // heads if heads else 0))
    return layers * kv_heads * 2 * head_dim * KV_BYTES_PER_VALUE
