"""Model files for admission tests: metadata only, no weights.

GGUF headers are written with the `gguf` package (key-values and tensor infos),
then the file is extended to its full size with a hole, so admission finds
every tensor's data inside the file without any being written; checkpoints are
a config.json and an optional stand-in for the safetensors files' size; the
Hugging Face cache is laid out the way huggingface_hub lays it out (refs/,
snapshots/ with symlinks into blobs/).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from itertools import cycle
from pathlib import Path
from typing import Any

import gguf
import numpy as np

Q = gguf.GGMLQuantizationType
ALIGNMENT = gguf.GGUF_DEFAULT_ALIGNMENT


def write_gguf_header(
    path: Path,
    architecture: str,
    file_type: gguf.LlamaFileType | None,
    tensor_types: Sequence[gguf.GGMLQuantizationType],
    *,
    layers: int = 4,
    heads: int = 4,
    kv_heads: int = 2,
    width: int = 256,
    context: int = 2048,
    vocabulary: int = 64,
) -> Path:
    """A model file whose header is complete and consistent: the tensors of a plain
    transformer of `layers` blocks, their weights in `tensor_types` in turn, norms in
    F32. The data section is a hole of the right size (zeros, no disk)."""
    writer = gguf.GGUFWriter(path, architecture)
    writer.add_block_count(layers)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_embedding_length(width)
    writer.add_feed_forward_length(width)
    writer.add_context_length(context)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"<t{index}>" for index in range(vocabulary)])
    if file_type is not None:
        writer.add_file_type(file_type)
    kv_width = width // heads * kv_heads
    weights = cycle(tensor_types)
    shapes = _transformer_shapes(layers, width, kv_width, vocabulary)
    data_bytes = 0
    for name, (columns, rows) in shapes.items():
        ggml_type = Q.F32 if name.endswith("norm.weight") else next(weights)
        data_bytes += _add_tensor(writer, name, columns, rows, ggml_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    _extend_with_hole(path, data_bytes)
    return path


def _transformer_shapes(
    layers: int, width: int, kv_width: int, vocabulary: int
) -> dict[str, tuple[int, int]]:
    """(elements per row, rows) of each tensor, as llama.cpp's llama builder wants them."""
    shapes = {"token_embd.weight": (width, vocabulary), "output_norm.weight": (width, 1)}
    for layer in range(layers):
        block = {
            "attn_norm": (width, 1),
            "attn_q": (width, width),
            "attn_k": (width, kv_width),
            "attn_v": (width, kv_width),
            "attn_output": (width, width),
            "ffn_norm": (width, 1),
            "ffn_gate": (width, width),
            "ffn_up": (width, width),
            "ffn_down": (width, width),
        }
        shapes.update({f"blk.{layer}.{role}.weight": shape for role, shape in block.items()})
    return shapes


def _add_tensor(writer: gguf.GGUFWriter, name: str, columns: int, rows: int, ggml_type: Q) -> int:
    """Adds the tensor's info; returns the bytes its data takes, padded as a writer pads."""
    block, block_bytes = gguf.GGML_QUANT_SIZES[ggml_type]
    row_bytes = columns // block * block_bytes
    shape = (row_bytes,) if rows == 1 else (rows, row_bytes)
    nbytes = rows * row_bytes
    writer.add_tensor_info(name, shape, np.dtype(np.uint8), nbytes, ggml_type)
    return nbytes + (-nbytes % ALIGNMENT)


def _extend_with_hole(path: Path, data_bytes: int) -> None:
    with path.open("r+b") as file:
        header = file.seek(0, 2)
        file.truncate(header + (-header % ALIGNMENT) + data_bytes)


def write_checkpoint(directory: Path, config: dict[str, Any], weights_bytes: int = 0) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    base = {
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "hidden_size": 64,
        "max_position_embeddings": 4096,
    }
    (directory / "config.json").write_text(json.dumps({**base, **config}))
    if weights_bytes:
        (directory / "model.safetensors").write_bytes(b"\0" * weights_bytes)
    return directory


def write_hub_snapshot(
    cache: Path, repo_id: str, files: dict[str, bytes], revision: str = "main"
) -> Path:
    """A repo in the hub cache: blobs, a snapshot of symlinks, and a ref naming it."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    commit = "0123456789abcdef0123456789abcdef01234567"
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / revision).write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo / "blobs").mkdir(exist_ok=True)
    for index, (name, data) in enumerate(files.items()):
        blob = repo / "blobs" / f"blob{index}"
        blob.write_bytes(data)
        (snapshot / name).symlink_to(Path("../../blobs") / blob.name)
    return snapshot


def add_hub_file(snapshot: Path, name: str, source: Path) -> Path:
    """Put a large file into a hub snapshot as the cache does: a blob, and a symlink to it.

    A real model can sit in a test's hub cache this way without being read into memory.
    """
    blobs = snapshot.parent.parent / "blobs"
    blobs.mkdir(exist_ok=True)
    blob = link_or_copy(source, blobs / f"blob-{name.replace('/', '-')}")
    link = snapshot / name
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(blob, link.parent))
    return link


def link_or_copy(source: Path, destination: Path) -> Path:
    """`destination` as a hard link to `source` where the file system allows, else a copy."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    try:
        destination.hardlink_to(source)
    except OSError:
        shutil.copyfile(source, destination)
    return destination
