"""Sampling every sequence of a step at once, with llama.cpp's semantics.

llama.cpp's sampler chain works on one sequence at a time and starts from the
whole vocabulary: with 128 streams of a 128k-token model that is 128 passes,
one after another, each copying and sorting 128k candidates. Here one pass
over the step's logits finds each row's few hundred best candidates, and
everything after that (the repetition penalty, top-k, top-p, min-p,
temperature and the draw) works on those, for all rows at once.

The result is the distribution llama.cpp's chain gives for the same settings
(tests/test_batch_sampling.py checks it against llama.cpp's own samplers):
the chain is penalties, top-k, top-p, min-p, temperature, then the draw, where
top-p and min-p read the probabilities before the temperature is applied.

Where service/backends/native/sampler.c was built, it does all of this in C,
row by row, the same way (the same tokens for the same numbers). Without it,
numpy finds the candidates by splitting each row into strided blocks and taking
each block's maximum (one pass, as fast as an argmax). The k largest values of a
row all lie in the k blocks with the largest maxima, since every block holds its
maximum and there are only k values at least as large as the k-th; so only those
blocks are searched.

A row without top-k (top_k 0) has no few best candidates to work on: sampler.c
draws it from the whole row, in passes whose cost does not depend on how many
tokens top-p keeps (its whole_row_draw), where llama.cpp's chain sorts them. Such
rows are batched only where sampler.c was built; elsewhere the chain draws them.

Each draw comes from a counter-based generator keyed by the request's seed
and the draw's index in that request, so a seeded request draws the same
numbers whichever other requests share its steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from service.backends.native import sampler as native_sampler
from service.text.requests import SamplingParams

# How many recent tokens the repetition penalty looks at (llama.cpp's default).
PENALTY_WINDOW = 64
# Rows wanting more candidates than this use llama.cpp's own chain.
MAX_TOP_K = 1024
# Candidates per block when searching a row (see the module docstring).
_BLOCK = 16

Floats = npt.NDArray[np.float32]
Doubles = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
Tokens = npt.NDArray[np.int32]


def batchable(params: SamplingParams) -> bool:
    """Whether this request's settings are sampled here, from each row's best
    candidates, rather than by llama.cpp."""
    return _rows_drawn_here(params) and (params.temperature == 0 or 0 < params.top_k <= MAX_TOP_K)


def drawn_from_whole_rows(params: SamplingParams) -> bool:
    """Whether this request's draws are sampler.c's draw over the whole row: sampled
    without top-k (top_k 0), where sampler.c was built. Its cost does not grow with
    how many tokens top-p keeps, where llama.cpp's chain sorts them."""
    return (
        params.temperature != 0
        and params.top_k == 0
        and _rows_drawn_here(params)
        and native_sampler.available()
    )


def _rows_drawn_here(params: SamplingParams) -> bool:
    if params.repeat_penalty < 1.0 or params.presence_penalty < 0 or params.frequency_penalty < 0:
        return False  # raises repeated tokens from anywhere in the row
    return not params.logit_bias  # raises or lowers any token: llama.cpp's logit-bias sampler


@dataclass(frozen=True)
class Row:
    """One sequence's draw: its settings, which draw of its request this is, and
    its recent tokens (prompt included) for the repetition penalty."""

    params: SamplingParams
    draw: int
    recent: Sequence[int] = ()


def sample_rows(logits: Floats, rows: Sequence[Row]) -> list[int]:
    """One token for each row of `logits` (rows x vocabulary): in C where it was
    built, else in numpy."""
    if native_sampler.available():
        draws = native_draws(logits, rows)
        draws.draw(0, len(rows))
        return draws.chosen()
    return sample_rows_in_numpy(logits, rows)


def sample_rows_in_numpy(logits: Floats, rows: Sequence[Row]) -> list[int]:
    width = candidates_needed([row.params for row in rows])
    return sample_candidates(*candidates_in_blocks(logits, best_blocks(logits, width), width), rows)


def best_of_row(line: Floats, k: int) -> tuple[Tokens, Floats]:
    """The ids and values of one row's `k` largest logits, in no order (fewer only
    when the row holds NaNs): in C where it was built, else by a numpy partition."""
    if native_sampler.available():
        return native_sampler.top_k_row(line, k)
    k = min(k, len(line))
    ids = np.argpartition(line, len(line) - k)[len(line) - k :].astype(np.int32)
    return ids, line[ids]


def native_draws(logits: Floats, rows: Sequence[Row]) -> native_sampler.StepDraws:
    """The step's draws, set up for sampler.c."""
    return native_sampler.StepDraws(logits, native_settings(rows), native_recent(rows))


def native_settings(rows: Sequence[Row]) -> Doubles:
    """The rows' settings as sampler.c reads them (a row each, see its SETTINGS)."""
    flat = [
        value
        for row in rows
        for value in (
            row.params.temperature,
            _candidates_wanted(row.params),
            row.params.top_p,
            row.params.min_p,
            row.params.repeat_penalty,
            row.params.presence_penalty,
            row.params.frequency_penalty,
            row.params.seed & 0xFFFFFFFF,
            row.draw & 0xFFFFFFFF,
        )
    ]
    return np.array(flat, dtype=np.float64).reshape(len(rows), native_sampler.SETTINGS)


def native_recent(rows: Sequence[Row]) -> Tokens | None:
    """Each row's recent tokens for sampler.c's repetition penalty (-1 pads), or None
    when no row has one."""
    if all(not row.params.penalized or not row.recent for row in rows):
        return None
    recent = np.full((len(rows), PENALTY_WINDOW), -1, dtype=np.int32)
    for i, row in enumerate(rows):
        if row.params.penalized and row.recent:
            window = row.recent[-PENALTY_WINDOW:]
            recent[i, : len(window)] = window
    return recent


def candidates_needed(settings: Sequence[SamplingParams]) -> int:
    """How many of each row's best logits the draws of these settings can reach."""
    return max(row_candidates(params) for params in settings)


def row_candidates(params: SamplingParams) -> int:
    """How many of a row's best logits its draw can reach: the top-k, and the recent
    tokens a penalty may push below others."""
    return _candidates_wanted(params) + (PENALTY_WINDOW if params.penalized else 0)


def sample_from_candidates(ids: Tokens, values: Floats, rows: Sequence[Row]) -> list[int]:
    """One token for each row from its best logits found elsewhere (in llama.cpp's
    graph: service/backends/llama_cpp/graph_sampling.py), at least `row_candidates` of
    them a row: in C where it was built, else in numpy. The same token as from the
    whole row."""
    if native_sampler.available():
        return native_sampler.draw_candidates(
            ids, values, native_settings(rows), native_recent(rows)
        )
    return sample_candidates(ids.astype(np.int64), values, rows)


def sample_candidates(ids: Ints, values: Floats, rows: Sequence[Row]) -> list[int]:
    """One token for each row, from its best `candidates_needed` logits (ids and
    values, a row each, in any order)."""
    values = values.copy()  # the penalty writes here, not to the caller's array
    if any(row.params.penalized for row in rows):
        _apply_penalties(ids, values, rows)
    order = np.argsort(-values, axis=1, kind="stable")
    ids = np.take_along_axis(ids, order, axis=1)
    ranked: Doubles = np.take_along_axis(values, order, axis=1).astype(np.float64)
    kept = _kept_counts(ranked, rows)
    picks = _draw(ranked, kept, rows)
    return [int(ids[i, pick]) for i, pick in enumerate(picks)]


def draw_among(ids: Tokens, values: Floats, floor: float, row: Row) -> int | None:
    """One row's draw from some of its candidates: `ids` and their raw logits, -inf
    for those ruled out (by a grammar: service/backends/llama_cpp/sampling.py), where
    every token left out has a logit of at most `floor` (-inf when none is left out).
    The token the draw over the whole row would give, or None when the tokens left
    out could change it.

    Tokens left out rank below every candidate above the floor, as a penalty of at
    least 1 only lowers logits. So when those candidates hold the top-k, the draw is
    theirs. When they hold fewer, the rest of the top-k is unknown but each weighs at
    most the floor's weight: if top-p and min-p keep the same candidates whether the
    unknown ones weigh nothing or that much, the draw is still decided.
    """
    penalized = values.astype(np.float32)[None, :]
    if row.params.penalized and row.recent:
        _apply_penalties(ids.astype(np.int64)[None, :], penalized, [row])
    above = np.flatnonzero(penalized[0] > floor)
    if not len(above):
        return None
    order = above[np.argsort(-penalized[0, above], kind="stable")]
    ranked: Doubles = penalized[:, order].astype(np.float64)
    kept = _kept_counts(ranked, [row])
    unknown = _candidates_wanted(row.params) - len(order)
    if unknown > 0 and floor > -np.inf:
        heaviest = np.concatenate([ranked, np.full((1, unknown), floor)], axis=1)
        if _kept_counts(heaviest, [row])[0] != kept[0]:
            return None
    return int(ids[order[_draw(ranked, kept, [row])[0]]])


def _candidates_wanted(params: SamplingParams) -> int:
    return 1 if params.temperature == 0 else params.top_k


def best_blocks(logits: Floats, k: int) -> Ints:
    """Each row's `k` blocks with the largest maxima (see the module docstring):
    the one pass over the whole rows, which is why it is what row threads split."""
    count, vocab = logits.shape
    blocks = vocab // _BLOCK
    if blocks <= k:  # a small vocabulary: every block
        return np.broadcast_to(np.arange(blocks), (count, blocks))
    # Block j of a row holds positions j, j + blocks, j + 2 * blocks, ...
    strided = logits[:, : blocks * _BLOCK].reshape(count, _BLOCK, blocks)
    chosen: Ints = np.argpartition(strided.max(axis=1), blocks - k, axis=1)[:, blocks - k :]
    return chosen


def candidates_in_blocks(logits: Floats, chosen: Ints, k: int) -> tuple[Ints, Floats]:
    """The `k` largest logits of each row's chosen blocks (and of the few ids at
    the end that belong to no block), ids and values in no order."""
    count, vocab = logits.shape
    blocks = vocab // _BLOCK
    main = blocks * _BLOCK
    ids = (chosen[:, None, :] + blocks * np.arange(_BLOCK)[None, :, None]).reshape(count, -1)
    if main < vocab:  # the last few ids belong to no block: always candidates
        tail = np.broadcast_to(np.arange(main, vocab), (count, vocab - main))
        ids = np.concatenate([ids, tail], axis=1)
    # One flat gather: take_along_axis builds an index per axis, which costs
    # several times the gather itself.
    values = np.take(logits.reshape(-1), ids + (np.arange(count) * vocab)[:, None])
    found = ids.shape[1]
    k = min(k, found)
    best = np.argpartition(values, found - k, axis=1)[:, found - k :]
    return np.take_along_axis(ids, best, axis=1), np.take_along_axis(values, best, axis=1)


def _apply_penalties(ids: Ints, values: Floats, rows: Sequence[Row]) -> None:
    """llama.cpp's penalties on recent tokens: a recent token's logit is divided by the
    repetition penalty when positive, multiplied when not, then lowered by the presence
    penalty and by the frequency penalty times its count (in float32, as llama.cpp).
    With penalties that only lower logits the best after them are among the best
    before, give or take the window's tokens, which is why the window widens the
    candidates."""
    for i, row in enumerate(rows):
        params = row.params
        if not params.penalized or not row.recent:
            continue
        tokens, counts = np.unique(np.asarray(row.recent[-PENALTY_WINDOW:]), return_counts=True)
        where = np.minimum(np.searchsorted(tokens, ids[i]), len(tokens) - 1)
        hit = tokens[where] == ids[i]
        hit_values = values[i, hit]
        repeat = np.float32(params.repeat_penalty)
        hit_values = np.where(hit_values <= 0, hit_values * repeat, hit_values / repeat)
        additive = counts[where[hit]].astype(np.float32) * np.float32(params.frequency_penalty)
        values[i, hit] = hit_values - (additive + np.float32(params.presence_penalty))


def _kept_counts(values: Doubles, rows: Sequence[Row]) -> Ints:
    """How many of each row's best candidates survive top-k, top-p and min-p."""
    width = values.shape[1]
    top_k = np.array([_candidates_wanted(row.params) for row in rows], dtype=np.int64)
    top_p = np.array([row.params.top_p for row in rows])
    min_p = np.array([row.params.min_p for row in rows])
    columns = np.arange(width)[None, :]
    in_top_k = columns < top_k[:, None]
    # top-p: the shortest run of candidates whose probabilities (temperature 1,
    # over the top-k) add up to top_p.
    weights = np.where(in_top_k, np.exp(values - values[:, :1]), 0.0)
    cumulative = np.cumsum(weights, axis=1) / weights.sum(axis=1, keepdims=True)
    reached = cumulative >= top_p[:, None]
    by_top_p = np.where(reached.any(axis=1), reached.argmax(axis=1) + 1, width)
    by_top_p = np.where(top_p >= 1.0, width, by_top_p)
    # min-p: candidates at least min_p times as likely as the best one.
    floor = values[:, :1] + np.log(np.where(min_p > 0, min_p, 1.0))[:, None]
    by_min_p = np.where(min_p > 0, (values >= floor).sum(axis=1), width)
    kept: Ints = np.maximum(np.minimum(np.minimum(top_k, by_top_p), by_min_p), 1)
    return kept


def _draw(values: Doubles, kept: Ints, rows: Sequence[Row]) -> Ints:
    """Which kept candidate each row draws, from softmax(logit / temperature)."""
    temperature = np.array([row.params.temperature for row in rows])
    greedy = temperature == 0
    scaled = (values - values[:, :1]) / np.where(greedy, 1.0, temperature)[:, None]
    columns = np.arange(values.shape[1])[None, :]
    weights = np.where(columns < kept[:, None], np.exp(scaled), 0.0)
    cumulative = np.cumsum(weights, axis=1)
    targets = uniform(rows) * cumulative[:, -1]
    picks = (cumulative <= targets[:, None]).sum(axis=1)
    picks = np.minimum(picks, kept - 1)
    chosen: Ints = np.where(greedy, 0, picks)
    return chosen


def uniform(rows: Sequence[Row]) -> Doubles:
    """One number in [0, 1) per row: SplitMix64 of (seed, draw index), so a
    request's draws depend on nothing but its seed and how far it has got."""
    return unit_interval(splitmix64(draw_keys(rows)))


def draw_keys(rows: Sequence[Row]) -> npt.NDArray[np.uint64]:
    """Each row's draw as one 64-bit key: its seed's low 32 bits, then its draw index's."""
    return np.array(
        [((row.params.seed & 0xFFFFFFFF) << 32) | (row.draw & 0xFFFFFFFF) for row in rows],
        dtype=np.uint64,
    )


def unit_interval(bits: npt.NDArray[np.uint64]) -> Doubles:
    """Random 64-bit words as numbers in [0, 1), from their top 53 bits."""
    return (bits >> np.uint64(11)).astype(np.float64) * 2.0**-53


def splitmix64(keys: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    z = keys + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))
