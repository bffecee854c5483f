"""What this build's ggml knows about each tensor type, asked of ggml itself.

A tensor type id is the index of a block format: how many elements a block
holds and how many bytes it takes. ggml keeps removed types' ids with a block
size of 0 and a name that says why, so the library, not a copied table, says
which ids this build decodes and how large each tensor's data is.
"""

from __future__ import annotations

import ctypes
from functools import cache
from pathlib import Path

# Types no model stores its weights in, on which llama.cpp's matrix product
# crashes the process: integers and doubles (I8, I16, I32, I64, F64), and Q8_K,
# ggml's intermediate format for the activations of k-quant products.
NOT_WEIGHT_TYPES = frozenset({24, 25, 26, 27, 28, 15})


@cache
def _ggml() -> ctypes.CDLL:
    import llama_cpp
    from llama_cpp._ctypes_extensions import load_shared_library

    lib: ctypes.CDLL = load_shared_library("ggml-base", Path(llama_cpp.__file__).parent / "lib")
    lib.ggml_type_name.restype = ctypes.c_char_p
    lib.ggml_type_name.argtypes = [ctypes.c_int]
    lib.ggml_blck_size.restype = ctypes.c_int64
    lib.ggml_blck_size.argtypes = [ctypes.c_int]
    lib.ggml_type_size.restype = ctypes.c_size_t
    lib.ggml_type_size.argtypes = [ctypes.c_int]
    return lib


@cache
def type_count() -> int:
    import llama_cpp

    return int(llama_cpp.GGML_TYPE_COUNT)


def type_problem(ggml_type: int) -> str | None:
    """Why this build cannot decode the type, or None when it can."""
    if not 0 <= ggml_type < type_count():
        return "the type is newer than this build"
    if block_size(ggml_type) == 0:  # removed types keep a name saying why
        return type_name(ggml_type)
    return None


@cache
def type_name(ggml_type: int) -> str:
    if not 0 <= ggml_type < type_count():
        return f"type {ggml_type}"
    return bytes(_ggml().ggml_type_name(ggml_type)).decode(errors="replace")


@cache
def block_size(ggml_type: int) -> int:
    """Elements per block; 0 for a removed or unknown type."""
    if not 0 <= ggml_type < type_count():
        return 0
    return int(_ggml().ggml_blck_size(ggml_type))


@cache
def block_bytes(ggml_type: int) -> int:
    return int(_ggml().ggml_type_size(ggml_type)) if block_size(ggml_type) else 0
