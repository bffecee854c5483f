"""The batched sampler's draw in C (sampler.c); `available()` is False where it was not built.

service.backends.batch_sampling does the same draw in numpy then: the same
tokens for the same numbers, with a few hundred microseconds more per step.
"""

from __future__ import annotations

import ctypes
import importlib.util
from functools import cache

import numpy as np
import numpy.typing as npt

Floats = npt.NDArray[np.float32]
Doubles = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
Tokens = npt.NDArray[np.int32]

# The columns of a row of settings, in sampler.c's order.
TEMPERATURE, TOP_K, TOP_P, MIN_P, REPEAT_PENALTY, PRESENCE, FREQUENCY, SEED, DRAW = range(9)
SETTINGS = 9


@cache
def _library() -> ctypes.CDLL | None:
    spec = importlib.util.find_spec("service.backends.native._sampler")
    if spec is None or spec.origin is None:
        return None
    library = ctypes.CDLL(spec.origin)
    pointer, size = ctypes.c_void_p, ctypes.c_int64
    library.sample_rows.argtypes = (pointer, size, size, size, pointer, pointer, size, size)
    library.sample_rows.argtypes += (pointer,)
    library.sample_rows.restype = ctypes.c_int
    library.top_k_row.argtypes = (pointer, size, size, pointer, pointer)
    library.top_k_row.restype = size
    library.sample_candidates.argtypes = (pointer, pointer, size, size, pointer, pointer, size)
    library.sample_candidates.argtypes += (pointer,)
    library.sample_candidates.restype = ctypes.c_int
    return library


def available() -> bool:
    return _library() is not None


def top_k_row(line: Floats, k: int) -> tuple[Tokens, Floats]:
    """The ids and values of the `k` largest of one row of logits (fewer only when it
    holds NaNs), in no order."""
    library = _library()
    if library is None:
        raise RuntimeError("service/backends/native/sampler.c was not built")
    line = np.ascontiguousarray(line, dtype=np.float32)
    k = max(0, min(k, len(line)))
    ids = np.empty(k, dtype=np.int32)
    values = np.empty(k, dtype=np.float32)
    found = library.top_k_row(line.ctypes.data, len(line), k, ids.ctypes.data, values.ctypes.data)
    if found < 0:
        raise MemoryError("the top-k could not allocate its scratch space")
    return ids[:found], values[:found]


def draw_candidates(
    ids: Tokens, values: Floats, settings: Doubles, recent: Tokens | None
) -> list[int]:
    """One token per row from each row's best candidates found elsewhere (ids and
    their logits, rows x count, in no order): what `StepDraws` draws from the whole
    rows, when `count` covers each row's top_k and penalty window."""
    library = _library()
    if library is None:
        raise RuntimeError("service/backends/native/sampler.c was not built")
    ids = np.ascontiguousarray(ids, dtype=np.int32)
    values = np.ascontiguousarray(values, dtype=np.float32)
    settings = np.ascontiguousarray(settings, dtype=np.float64)
    recent = None if recent is None else np.ascontiguousarray(recent, dtype=np.int32)
    tokens = np.empty(len(ids), dtype=np.int64)
    status = library.sample_candidates(
        ids.ctypes.data,
        values.ctypes.data,
        ids.shape[0],
        ids.shape[1],
        settings.ctypes.data,
        None if recent is None else recent.ctypes.data,
        0 if recent is None else recent.shape[1],
        tokens.ctypes.data,
    )
    if status != 0:
        raise MemoryError("the candidate draw could not allocate its scratch space")
    chosen: list[int] = tokens.tolist()
    return chosen


class StepDraws:
    """One token per row of `logits` into `tokens`, by the matching row of `settings`
    (SETTINGS columns: TEMPERATURE, 0 for greedy; TOP_K, at least 1, or 0 for a draw
    over the whole row (sampler.c's whole_row_draw); TOP_P; MIN_P;
    REPEAT_PENALTY, PRESENCE and FREQUENCY, the penalties; SEED and DRAW, the
    request's seed and which of its draws this is, of which the draw's number comes
    as in batch_sampling.uniform). `recent` holds each row's recent token ids (-1
    pads), or is None when no row has a penalty.

    Set up once per step; `draw(begin, end)` then does a block of rows in C, without
    the GIL, so blocks on several threads run in parallel; `chosen()` is the tokens.
    """

    def __init__(self, logits: Floats, settings: Doubles, recent: Tokens | None) -> None:
        library = _library()
        if library is None:
            raise RuntimeError("service/backends/native/sampler.c was not built")
        self._call = library.sample_rows
        if logits.dtype != np.float32 or logits.strides[1] != logits.itemsize:
            logits = np.ascontiguousarray(logits, dtype=np.float32)
        self._settings = np.ascontiguousarray(settings, dtype=np.float64)
        self._recent = None if recent is None else np.ascontiguousarray(recent, dtype=np.int32)
        self._logits = logits  # kept alive while its address is in use
        self.tokens: Ints = np.empty(len(logits), dtype=np.int64)
        self._columns = logits.shape[1]
        self._stride = logits.strides[0] // logits.itemsize
        self._window = 0 if self._recent is None else self._recent.shape[1]
        self._widest = max(1, int(self._settings[:, TOP_K].max())) if len(logits) else 1
        self._addresses = (
            logits.ctypes.data,
            self._settings.ctypes.data,
            0 if self._recent is None else self._recent.ctypes.data,
            self.tokens.ctypes.data,
        )

    def chosen(self) -> list[int]:
        tokens: list[int] = self.tokens.tolist()
        return tokens

    def draw(self, begin: int, end: int) -> None:
        if end <= begin:
            return
        logits, settings, recent, tokens = self._addresses
        status = self._call(
            logits + begin * self._stride * 4,
            end - begin,
            self._columns,
            self._stride,
            settings + begin * SETTINGS * 8,
            recent + begin * self._window * 4 if recent else None,
            self._window,
            self._widest,
            tokens + begin * 8,
        )
        if status != 0:
            raise MemoryError("the batched sampler could not allocate its scratch space")
