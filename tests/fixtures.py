"""Model files for admission tests: metadata only, no weights.

GGUF headers are written with the `gguf` package (key-values and tensor infos,
no tensor data); checkpoints are a config.json and an optional stand-in for
the safetensors files' size; the Hugging Face cache is laid out the way
huggingface_hub lays it out (refs/, snapshots/ with symlinks into blobs/).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gguf
import numpy as np

Q = gguf.GGMLQuantizationType


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
) -> Path:
    writer = gguf.GGUFWriter(path, architecture)
    writer.add_block_count(layers)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_embedding_length(width)
    writer.add_context_length(context)
    if file_type is not None:
        writer.add_file_type(file_type)
    for index, ggml_type in enumerate(tensor_types):
        _, type_size = gguf.GGML_QUANT_SIZES[ggml_type]
        shape = (width, 4 * type_size)  # in bytes: 4 blocks per row
        nbytes = width * 4 * type_size
        writer.add_tensor_info(f"blk.{index}.weight", shape, np.dtype(np.uint8), nbytes, ggml_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    return path


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
