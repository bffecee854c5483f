"""Sampling inside llama.cpp's graph (graph_sampler.c): the samplers of one context.

One sampler per sequence id is handed to llama.cpp when the context is made
(`attach`), never changed after (a change makes llama.cpp reserve its graphs
again); before each step the backend writes each sequence's mode in `modes`:

- HOST: the row's whole logits come back (llama_get_sampled_logits_ith);
- GREEDY: its argmax alone (llama_get_sampled_token_ith);
- TOP: its `top` best token ids and logits (llama_get_sampled_candidates_ith and
  llama_get_sampled_logits_ith), for sampler.c's sample_candidates;
- ROW: the whole draw in the graph, by the settings written in `row_params` (a row
  of ROW_PARAMS floats per sequence id, see `row_settings`) before `next_step`; its
  token alone comes back (llama_get_sampled_token_ith).

`available()` is False where the library was not built
(service.backends.native.build_graph_sampler).
"""

from __future__ import annotations

import ctypes
from functools import cache
from pathlib import Path

import llama_cpp
import numpy as np
import numpy.typing as npt

HOST, GREEDY, TOP, ROW = 0, 1, 2, 3
# A ROW row's settings: 1/temperature, top_p, log(min_p), a number per round.
ROW_ROUNDS = 3
ROW_PARAMS = 3 + ROW_ROUNDS
NO_TOP_P = 2.0  # top_p above 1: every token passes
NO_MIN_P = -1e30  # log(min_p) for none
_LIBRARY = Path(__file__).resolve().parent / "_graph_sampler.so"


@cache
def _library() -> ctypes.CDLL | None:
    if not _LIBRARY.is_file():
        return None
    library = ctypes.CDLL(str(_LIBRARY))
    pointer = ctypes.c_void_p
    library.gs_plan_new.argtypes = (ctypes.c_int32,)
    library.gs_plan_new.restype = pointer
    library.gs_plan_free.argtypes = (pointer,)
    library.gs_plan_free.restype = None
    library.gs_plan_modes.argtypes = (pointer,)
    library.gs_plan_modes.restype = ctypes.POINTER(ctypes.c_uint8)
    library.gs_plan_set_top.argtypes = (pointer, ctypes.c_int32)
    library.gs_plan_set_top.restype = None
    library.gs_sampler_new.argtypes = (pointer, ctypes.c_int32)
    library.gs_sampler_new.restype = pointer
    library.gs_plan_row_params.argtypes = (pointer,)
    library.gs_plan_row_params.restype = ctypes.POINTER(ctypes.c_float)
    library.gs_plan_next_step.argtypes = (pointer,)
    library.gs_plan_next_step.restype = None
    library.gs_row_params.argtypes = ()
    library.gs_row_params.restype = ctypes.c_int32
    library.gs_draw_rows_on_cpu.argtypes = (
        ctypes.POINTER(ctypes.c_float),
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.POINTER(ctypes.c_float),
        ctypes.POINTER(ctypes.c_int32),
        ctypes.c_int,
    )
    library.gs_draw_rows_on_cpu.restype = ctypes.c_int
    library.gs_top_on_cpu.argtypes = (
        ctypes.POINTER(ctypes.c_float),
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.POINTER(ctypes.c_int32),
        ctypes.POINTER(ctypes.c_float),
        ctypes.c_int,
    )
    library.gs_top_on_cpu.restype = ctypes.c_int
    if library.gs_row_params() != ROW_PARAMS:
        return None  # built from another version of graph_sampler.c
    return library


def available() -> bool:
    return _library() is not None


class GraphSamplers:
    """A sampler for each of `sequences` sequence ids, sharing one plan."""

    def __init__(self, sequences: int) -> None:
        library = _library()
        if library is None:
            raise RuntimeError("service/backends/native/graph_sampler.c was not built")
        self._library = library
        self._plan = library.gs_plan_new(sequences)
        if not self._plan:
            raise MemoryError("the graph sampler's plan could not be allocated")
        self.modes: npt.NDArray[np.uint8] = np.ctypeslib.as_array(
            library.gs_plan_modes(self._plan), shape=(sequences,)
        )
        self.row_params: npt.NDArray[np.float32] = np.ctypeslib.as_array(
            library.gs_plan_row_params(self._plan), shape=(sequences, ROW_PARAMS)
        )
        self._chains = [library.gs_sampler_new(self._plan, seq_id) for seq_id in range(sequences)]
        if not all(self._chains):
            self.close()
            raise MemoryError("a graph sampler could not be allocated")
        configs = llama_cpp.llama_sampler_seq_config * sequences
        self._configs = configs(
            *[
                llama_cpp.llama_sampler_seq_config(seq_id, chain)
                for seq_id, chain in enumerate(self._chains)
            ]
        )
        self.top = 1
        self._retired: list[int] = []

    def attach(self, params: llama_cpp.llama_context_params) -> None:
        """Give the samplers to the context these parameters will make: one output per
        sequence a step, the backend's plan (llama.cpp's prompt steps want only the
        last token's)."""
        seq_config = ctypes.POINTER(llama_cpp.llama_sampler_seq_config)
        params.samplers = ctypes.cast(self._configs, seq_config)
        params.n_samplers = len(self._chains)
        params.n_outputs_max_per_seq = 1

    def renew(self, context: llama_cpp.llama_context_p, seq_id: int) -> None:
        """Replace one sequence's sampler with a new one: llama.cpp then builds its
        graphs afresh at the next decode, never reusing one made for other paths."""
        chain = self._library.gs_sampler_new(self._plan, seq_id)
        if not chain:
            raise MemoryError("a graph sampler could not be allocated")
        if not llama_cpp.llama_set_sampler(context, seq_id, _sampler(chain)):
            llama_cpp.llama_sampler_free(_sampler(chain))
            raise RuntimeError(f"llama.cpp refused a new sampler for sequence {seq_id}")
        # The old one may still be named by llama.cpp's last graph: freed at close.
        self._retired.append(self._chains[seq_id])
        self._chains[seq_id] = chain

    def next_step(self) -> None:
        """The modes and ROW settings written since are the next decode's."""
        self._library.gs_plan_next_step(self._plan)

    def set_top(self, top: int) -> None:
        """Candidates per TOP row, for the next step."""
        self.top = max(1, top)
        self._library.gs_plan_set_top(self._plan, self.top)

    def close(self) -> None:
        """Free the samplers; only once the context they were given to is freed."""
        for chain in [*self._chains, *self._retired]:
            if chain:
                llama_cpp.llama_sampler_free(_sampler(chain))
        self._chains, self._retired = [], []
        if self._plan:
            self._library.gs_plan_free(self._plan)
            self._plan = None


def _sampler(address: int) -> llama_cpp.llama_sampler_p:
    """A sampler's address as llama-cpp-python's bindings take it."""
    return ctypes.cast(address, llama_cpp.llama_sampler_p_ctypes)


def draw_rows_on_cpu(
    logits: npt.NDArray[np.float32], settings: npt.NDArray[np.float32], threads: int = 2
) -> npt.NDArray[np.int32]:
    """The ROW draw of each row of `logits` (rows x vocabulary) by `settings` (rows x
    ROW_PARAMS), computed by ggml on the CPU with the graph's own operations: for
    tests that choose the logits."""
    library = _library()
    if library is None:
        raise RuntimeError("service/backends/native/graph_sampler.c was not built")
    logits = np.ascontiguousarray(logits, dtype=np.float32)
    settings = np.ascontiguousarray(settings, dtype=np.float32)
    rows, vocabulary = logits.shape
    if settings.shape != (rows, ROW_PARAMS):
        raise ValueError(f"settings must be {rows} x {ROW_PARAMS}, not {settings.shape}")
    tokens = np.empty(rows, dtype=np.int32)
    floats = ctypes.POINTER(ctypes.c_float)
    status = library.gs_draw_rows_on_cpu(
        logits.ctypes.data_as(floats),
        vocabulary,
        rows,
        settings.ctypes.data_as(floats),
        tokens.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
        threads,
    )
    if status != 0:
        raise RuntimeError("ggml could not compute the rows' draw on the CPU")
    return tokens


def top_on_cpu(
    logits: npt.NDArray[np.float32], k: int, threads: int = 2
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.float32]]:
    """The TOP candidates of each row of `logits` (rows x vocabulary): its `k` largest
    logits' token ids and values (rows x k each, largest first), computed by ggml on
    the CPU with the graph's own operations, as draw_rows_on_cpu."""
    library = _library()
    if library is None:
        raise RuntimeError("service/backends/native/graph_sampler.c was not built")
    logits = np.ascontiguousarray(logits, dtype=np.float32)
    rows, vocabulary = logits.shape
    ids = np.empty((rows, k), dtype=np.int32)
    values = np.empty((rows, k), dtype=np.float32)
    status = library.gs_top_on_cpu(
        logits.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
        vocabulary,
        rows,
        k,
        ids.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
        values.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
        threads,
    )
    if status != 0:
        raise RuntimeError("ggml could not compute the rows' candidates on the CPU")
    return ids, values
