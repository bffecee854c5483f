"""Each row's k largest logits, by top_k.c; `available()` is False where it was not built.

The batched sampler (service.backends.batch_sampling) falls back to its numpy
search then: the same candidates, about three argmaxes' time instead of one.
"""

from __future__ import annotations

import ctypes
import importlib.util
from functools import cache

import numpy as np
import numpy.typing as npt

Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float32]

# top_k.c's SLACK (buffer slots per kept candidate) and CHUNK (columns per chunk).
_SLACK = 8
_CHUNK = 64


@cache
def _library() -> ctypes.CDLL | None:
    spec = importlib.util.find_spec("service.backends.native._top_k")
    if spec is None or spec.origin is None:
        return None
    library = ctypes.CDLL(spec.origin)
    pointer = ctypes.c_void_p
    library.top_k_rows.argtypes = [pointer] + [ctypes.c_int64] * 4 + [pointer] * 5
    library.top_k_rows.restype = None
    return library


def available() -> bool:
    return _library() is not None


def top_k_rows(logits: Floats, k: int) -> tuple[Ints, Floats]:
    """The ids and values of each row's `k` largest logits (at most the row's
    length), in no order. The C loop runs without the GIL."""
    library = _library()
    if library is None:
        raise RuntimeError("service/backends/native/top_k.c was not built")
    if logits.dtype != np.float32 or logits.strides[1] != logits.itemsize:
        logits = np.ascontiguousarray(logits, dtype=np.float32)
    rows, columns = logits.shape
    k = min(k, columns)
    ids = np.empty((rows, k), dtype=np.int64)
    values = np.empty((rows, k), dtype=np.float32)
    if rows == 0 or k == 0:
        return ids, values
    scratch_values = np.empty(_SLACK * k, dtype=np.float32)
    scratch_ids = np.empty(_SLACK * k, dtype=np.int32)
    maxima = np.empty(columns // _CHUNK + 1, dtype=np.float32)
    library.top_k_rows(
        logits.ctypes.data,
        rows,
        columns,
        logits.strides[0] // logits.itemsize,
        k,
        ids.ctypes.data,
        values.ctypes.data,
        scratch_values.ctypes.data,
        scratch_ids.ctypes.data,
        maxima.ctypes.data,
    )
    return ids, values
