"""Which of a step's rows are sampled inside llama.cpp's graph, and reading what it gave.

With in-graph sampling on (service/backends/native/graph_sampler.c), each row
takes one of three paths, by what its request asks:

- plain greedy, no logprobs: GREEDY, the argmax in the graph; the token alone
  comes back;
- the common sampled settings (the batched sampler's: penalties that only lower a
  logit, a top-k) whose draw reads at most GRAPH_TOP candidates, no logprobs: TOP,
  the GRAPH_TOP best logits and their ids come back and sampler.c draws from them,
  the same token as from the whole row;
- sampled without top-k or penalties, at a temperature up to 1 and a top_p of at
  least ROW_LEAST_TOP_P (or none): ROW, the whole draw in the graph
  (graph_sampler.c's build_row_draws, by rejection, whose cost does not grow with
  how many tokens top-p keeps); the token alone comes back. Its numbers are the
  request's seed and draw index, as on the host, so the same seed gives the same
  tokens alone or beside any other rows (a different token from the host's draw
  for the same numbers: the two walk the kept tokens differently);
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

import math
from collections.abc import Sequence
from dataclasses import dataclass

import llama_cpp
import numpy as np
import numpy.typing as npt

from service.backends.batch_sampling import (
    Row,
    draw_keys,
    drawn_from_whole_rows,
    row_candidates,
    sample_from_candidates,
    splitmix64,
    unit_interval,
)
from service.backends.native import graph_sampler
from service.backends.native.graph_sampler import (
    GREEDY,
    HOST,
    NO_MIN_P,
    NO_TOP_P,
    ROW,
    ROW_PARAMS,
    ROW_ROUNDS,
    TOP,
    GraphSamplers,
)
from service.text.requests import SamplingParams

__all__ = [
    "GRAPH_TOP",
    "GREEDY",
    "HOST",
    "ROW",
    "TOP",
    "GraphSampling",
    "PlannedRow",
    "RowPath",
    "row_settings",
]

# Candidates a TOP row brings back: a top-k of 64 with the repetition penalty's
# window (64), or of 128 without it. The graph's top-k is built with this size
# once; a size per step would change the graph's shape with the requests.
GRAPH_TOP = 128

# The least top_p a ROW row may have: each round of the graph's draw fails with a
# chance of at most 1 - top_p (at temperatures up to 1), and after ROW_ROUNDS failed
# rounds the row's best token is taken: here at most 0.2**3, 0.8% of draws, and
# 0.05**3 (1 in 8,000) at the common 0.95. Lower top_p values are drawn on the host.
ROW_LEAST_TOP_P = 0.8


def drawn_whole_in_graph(params: SamplingParams) -> bool:
    """Whether a batched row's draw can be the graph's whole-row draw (ROW)."""
    return (
        0 < params.temperature <= 1
        and params.top_k == 0
        and not params.penalized
        and params.top_p >= ROW_LEAST_TOP_P
    )


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
        if self.batched and drawn_whole_in_graph(self.params):
            return ROW
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

    def plan(
        self,
        context: llama_cpp.llama_context_p,
        rows: Sequence[PlannedRow],
        row_draws: Sequence[tuple[int, Row]] = (),
    ) -> None:
        """Write this step's paths before its decode, and the numbers of its ROW
        draws (sequence id, draw)."""
        shape = tuple((row.seq_id, row.tokens, row.output) for row in rows)
        modes = {row.seq_id: row.mode for row in rows if row.output}
        if shape == self._shape:  # llama.cpp would reuse the last graph as it is
            for seq_id, mode in modes.items():
                if self._modes.get(seq_id, mode) != mode:
                    self.samplers.renew(context, seq_id)
                    self.renewed += 1
        # Sequences not in the step add nothing to a graph built for it (llama.cpp
        # still asks their samplers, for a row they do not own).
        self.samplers.modes[:] = HOST
        for seq_id, mode in modes.items():
            self.samplers.modes[seq_id] = mode
        if row_draws:
            seq_ids = [seq_id for seq_id, _ in row_draws]
            self.samplers.row_params[seq_ids] = row_settings([draw for _, draw in row_draws])
        self.samplers.next_step()
        self._shape, self._modes = shape, modes

    def close(self) -> None:
        self.samplers.close()


def row_settings(rows: Sequence[Row]) -> npt.NDArray[np.float32]:
    """ROW draws' settings as graph_sampler.c reads them (a row of ROW_PARAMS each):
    1/temperature, top_p, log(min_p), then a number in [0, 1) per round. The first
    round's number is the host's draw's (SplitMix64 of the seed and draw index); the
    later ones are drawn on from it, so each depends only on the seed and the index."""
    settings = np.empty((len(rows), ROW_PARAMS), dtype=np.float64)
    for index, row in enumerate(rows):
        params = row.params
        settings[index, 0] = 1.0 / params.temperature
        settings[index, 1] = params.top_p if params.top_p < 1 else NO_TOP_P
        settings[index, 2] = math.log(params.min_p) if params.min_p > 0 else NO_MIN_P
    chained = splitmix64(draw_keys(rows))
    settings[:, 3] = unit_interval(chained)  # what uniform(rows) gives the host's draw
    for round_ in range(1, ROW_ROUNDS):
        settings[:, 3 + round_] = unit_interval(splitmix64(chained + np.uint64(round_)))
    # float32's nearest to a number under 1 may be 1: keep the numbers below it.
    settings[:, 3:] = np.minimum(settings[:, 3:], np.nextafter(np.float32(1), np.float32(0)))
    return settings.astype(np.float32)


def sampled_token(context: llama_cpp.llama_context_p, output: int) -> int:
    """A GREEDY or ROW row's token."""
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
