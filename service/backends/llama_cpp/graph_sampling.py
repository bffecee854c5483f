"""Which of a step's rows are sampled inside llama.cpp's graph, and reading what it gave.

With in-graph sampling on (service/backends/native/graph_sampler.c), each row
takes one of three paths, by what its request asks:

- plain greedy, no logprobs: GREEDY, the argmax in the graph; the token alone
  comes back;
- the common sampled settings (the batched sampler's: penalties that only lower a
  logit, a top-k) whose draw reads at most GRAPH_TOP candidates, no logprobs: TOP,
  the GRAPH_TOP best logits and their ids come back and sampler.c draws from them,
  the same token as from the whole row;
- anything else (a grammar or JSON schema, top logprobs, a top-k past the
  candidates, settings llama.cpp's own chain samples): HOST, the row's logits come
  back as without in-graph sampling, and today's host path draws, in the same
  step: one constrained request does not slow the others.

llama.cpp reuses a step's graph, unchanged, for a next step of the same shape
(the same sequences, tokens and outputs), and the paths are in the graph. A path
changes only when a new request takes a sequence id, whose first step is then
nearly always shaped differently (its prompt against the last request's one
token). When it is not (a prompt cached but for its last token, in a step
otherwise like the last), that sequence's sampler is replaced by a new one, which
makes llama.cpp build its graphs afresh (tens of milliseconds on a GPU, rarely).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import llama_cpp
import numpy as np
import numpy.typing as npt

from service.backends.batch_sampling import (
    Row,
    drawn_from_whole_rows,
    row_candidates,
    sample_from_candidates,
)
from service.backends.native import graph_sampler
from service.backends.native.graph_sampler import GREEDY, HOST, TOP, GraphSamplers

__all__ = ["GRAPH_TOP", "GREEDY", "HOST", "TOP", "GraphSampling", "PlannedRow", "RowPath"]
from service.text.requests import SamplingParams

# Candidates a TOP row brings back: a top-k of 64 with the repetition penalty's
# window (64), or of 128 without it. The graph's top-k is built with this size
# once; a size per step would change the graph's shape with the requests.
GRAPH_TOP = 128


@dataclass(frozen=True)
class RowPath:
    """How one row of a step is sampled."""

    greedy: bool
    batched: bool
    params: SamplingParams
    logprobs: bool

    @property
    def mode(self) -> int:
        if self.logprobs:
            return HOST
        if self.greedy:
            return GREEDY
        whole_row = drawn_from_whole_rows(self.params)  # the graph finds only a top-k
        if self.batched and not whole_row and row_candidates(self.params) <= GRAPH_TOP:
            return TOP
        return HOST


@dataclass(frozen=True)
class PlannedRow:
    """A chunk of this step as the graph sees it."""

    seq_id: int
    tokens: int
    output: bool
    mode: int


class GraphSampling:
    """The in-graph samplers of one context, and the shape of the last step."""

    def __init__(self, sequences: int, top_candidates: bool = True) -> None:
        """`top_candidates`: sampled rows take the TOP path; without it only greedy
        rows are drawn in the graph and the rest take the HOST path."""
        self.samplers = GraphSamplers(sequences)
        self._top_candidates = top_candidates
        self.samplers.set_top(GRAPH_TOP)
        self._shape: tuple[tuple[int, int, bool], ...] = ()
        self._modes: dict[int, int] = {}  # seq id -> its path in the last step
        self.renewed = 0  # samplers replaced to keep a graph from being reused

    @staticmethod
    def available() -> bool:
        return graph_sampler.available()

    def mode(self, path: RowPath) -> int:
        """The path a row takes in this context."""
        if path.mode == TOP and not self._top_candidates:
            return HOST
        return path.mode

    def attach(self, params: llama_cpp.llama_context_params) -> None:
        self.samplers.attach(params)

    def plan(self, context: llama_cpp.llama_context_p, rows: Sequence[PlannedRow]) -> None:
        """Write this step's paths before its decode."""
        shape = tuple((row.seq_id, row.tokens, row.output) for row in rows)
        modes = {row.seq_id: row.mode for row in rows if row.output}
        if shape == self._shape:  # llama.cpp would reuse the last graph as it is
            for seq_id, mode in modes.items():
                if self._modes.get(seq_id, mode) != mode:
                    self.samplers.renew(context, seq_id)
                    self.renewed += 1
        for seq_id, mode in modes.items():
            self.samplers.modes[seq_id] = mode
        self._shape, self._modes = shape, modes

    def close(self) -> None:
        self.samplers.close()


def sampled_token(context: llama_cpp.llama_context_p, output: int) -> int:
    """A GREEDY row's token."""
    return int(llama_cpp.llama_get_sampled_token_ith(context, output))


def row_logits(
    context: llama_cpp.llama_context_p, output: int, n_vocab: int
) -> npt.NDArray[np.float32]:
    """A HOST row's logits, viewed in llama.cpp's buffer."""
    pointer = llama_cpp.llama_get_sampled_logits_ith(context, output)
    return np.ctypeslib.as_array(pointer, shape=(n_vocab,))


def top_draws(
    context: llama_cpp.llama_context_p, outputs: Sequence[int], rows: Sequence[Row]
) -> list[int]:
    """The TOP rows' tokens: each row's candidates from the graph, drawn by sampler.c."""
    ids = np.empty((len(outputs), GRAPH_TOP), dtype=np.int32)
    values = np.empty((len(outputs), GRAPH_TOP), dtype=np.float32)
    for index, output in enumerate(outputs):
        count = int(llama_cpp.llama_get_sampled_candidates_count_ith(context, output))
        if count != GRAPH_TOP:
            raise RuntimeError(f"llama.cpp gave {count} candidates for a row, not {GRAPH_TOP}")
        ids[index] = np.ctypeslib.as_array(
            llama_cpp.llama_get_sampled_candidates_ith(context, output), shape=(count,)
        )
        values[index] = np.ctypeslib.as_array(
            llama_cpp.llama_get_sampled_logits_ith(context, output), shape=(count,)
        )
    return sample_from_candidates(ids, values, rows)
