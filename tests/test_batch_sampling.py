"""The batched sampler against llama.cpp's own sampler chain, on fixed logits:
the same settings must give the same distribution (a two-sample chi-square
test on thousands of draws), and a sampler that is wrong must be caught."""

from __future__ import annotations

import ctypes
import math
from collections import Counter

import llama_cpp
import numpy as np
import pytest

from service.backends.batch_sampling import (
    MAX_TOP_K,
    PENALTY_WINDOW,
    Row,
    batchable,
    draw_among,
    drawn_from_whole_rows,
    sample_rows,
    uniform,
)
from service.backends.native import sampler as native_sampler
from service.text.requests import SamplingParams

DRAWS = 12_000
VOCAB = 3_000
TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


def fixed_logits(shift: float = 0.0, seed: int = 3) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(VOCAB) * 2.5 + shift).astype(np.float32)


def params(**overrides: float) -> SamplingParams:
    values = {
        "temperature": 0.8,
        "top_p": 0.95,
        "top_k": 40,
        "min_p": 0.05,
        "repeat_penalty": 1.0,
        "seed": 11,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
    }
    values.update(overrides)
    return SamplingParams(**values)  # type: ignore[arg-type]


def llama_cpp_draws(
    logits: np.ndarray, sampling: SamplingParams, recent: list[int]
) -> Counter[int]:
    """`DRAWS` tokens from llama.cpp's chain, built in llama-cpp-python's order."""
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())

    def add(sampler: object) -> None:
        llama_cpp.llama_sampler_chain_add(chain, sampler)

    if sampling.penalized:
        penalties = llama_cpp.llama_sampler_init_penalties(
            VOCAB,
            PENALTY_WINDOW,
            sampling.repeat_penalty,
            sampling.frequency_penalty,
            sampling.presence_penalty,
        )
        for token in recent:
            llama_cpp.llama_sampler_accept(penalties, token)
        add(penalties)
    add(llama_cpp.llama_sampler_init_top_k(sampling.top_k))
    add(llama_cpp.llama_sampler_init_top_p(sampling.top_p, 1))
    add(llama_cpp.llama_sampler_init_min_p(sampling.min_p, 1))
    add(llama_cpp.llama_sampler_init_temp(sampling.temperature))
    add(llama_cpp.llama_sampler_init_dist(sampling.seed))
    candidates = np.zeros(VOCAB, dtype=TOKEN_DATA)
    drawn: Counter[int] = Counter()
    try:
        for _ in range(DRAWS):
            candidates["id"] = np.arange(VOCAB)
            candidates["logit"] = logits
            candidates["p"] = 0.0
            array = llama_cpp.llama_token_data_array(
                data=candidates.ctypes.data_as(llama_cpp.llama_token_data_p),
                size=VOCAB,
                selected=-1,
                sorted=False,
            )
            llama_cpp.llama_sampler_apply(chain, ctypes.byref(array))
            drawn[int(candidates[array.selected]["id"])] += 1
    finally:
        llama_cpp.llama_sampler_free(chain)
    return drawn


def our_draws(logits: np.ndarray, sampling: SamplingParams, recent: list[int]) -> Counter[int]:
    drawn: Counter[int] = Counter()
    for start in range(0, DRAWS, 2_000):
        rows = [Row(sampling, draw, recent) for draw in range(start, start + 2_000)]
        drawn.update(sample_rows(np.tile(logits, (len(rows), 1)), rows))
    return drawn


def same_distribution_z(first: Counter[int], second: Counter[int]) -> float:
    """Two-sample chi-square over the tokens drawn (rare ones pooled), as a z-score
    (Wilson-Hilferty): about N(0, 1) when both samples come from one distribution."""
    tokens = sorted(set(first) | set(second), key=lambda t: -(first[t] + second[t]))
    bins: list[tuple[int, int]] = []
    pooled = (0, 0)
    for token in tokens:
        pair = (first[token], second[token])
        if sum(pair) >= 10:
            bins.append(pair)
        else:
            pooled = (pooled[0] + pair[0], pooled[1] + pair[1])
    if sum(pooled):
        bins.append(pooled)
    statistic = sum((a - b) ** 2 / (a + b) for a, b in bins)
    freedom = len(bins) - 1
    if freedom == 0:
        return 0.0
    scale = 2 / (9 * freedom)
    return float(((statistic / freedom) ** (1 / 3) - (1 - scale)) / math.sqrt(scale))


CASES = {
    "defaults": (params(), 0.0, ""),
    "hot and wide": (params(temperature=1.4, top_p=0.9, top_k=200, min_p=0.0), 0.0, ""),
    "min-p decides": (params(temperature=0.9, top_p=1.0, top_k=60, min_p=0.03), 0.0, ""),
    "repetition penalty, positive logits": (
        params(repeat_penalty=1.5, min_p=0.0),
        0.0,
        "top",
    ),
    "repetition penalty, negative logits": (
        params(repeat_penalty=1.3, top_k=30, min_p=0.0, temperature=1.0),
        -12.0,
        "top",
    ),
    "presence and frequency penalties, tokens repeated": (
        params(presence_penalty=0.7, frequency_penalty=0.4, repeat_penalty=1.1, min_p=0.0),
        0.0,
        "repeated",
    ),
    # Without top-k: sampler.c's draw over the whole row.
    "no top-k, top-p decides": (params(top_k=0, top_p=0.9, min_p=0.0), 0.0, ""),
    "no top-k, hot": (params(top_k=0, temperature=1.4, top_p=0.8, min_p=0.0), 0.0, ""),
    "no top-k, min-p decides": (params(top_k=0, top_p=1.0, min_p=0.02), 0.0, ""),
    "no top-k, both, with penalties": (
        params(top_k=0, top_p=0.7, min_p=0.01, repeat_penalty=1.3, presence_penalty=0.5),
        0.0,
        "repeated",
    ),
}


def recent_tokens(logits: np.ndarray, kind: str) -> list[int]:
    """The window the penalties read: none, some of the best tokens once each, or the
    best few up to four times each (so counts matter)."""
    best = [int(t) for t in np.argsort(-logits)]
    if kind == "top":
        return best[:PENALTY_WINDOW:3]
    if kind == "repeated":
        return [token for rank, token in enumerate(best[:12]) for _ in range(1 + rank % 4)]
    return []


@pytest.mark.slow  # thousands of draws from both samplers
@pytest.mark.parametrize("case", list(CASES))
def test_the_same_settings_give_llama_cpps_distribution(case: str) -> None:
    sampling, shift, recent_kind = CASES[case]
    if sampling.top_k == 0 and not native_sampler.available():
        pytest.skip("rows without top-k are drawn by sampler.c, which was not built")
    logits = fixed_logits(shift)
    recent = recent_tokens(logits, recent_kind)
    ours = our_draws(logits, sampling, recent)
    theirs = llama_cpp_draws(logits, sampling, recent)
    assert len(ours) >= 4  # a real distribution, not one token
    assert same_distribution_z(ours, theirs) < 4.5


@pytest.mark.slow  # thousands of draws from both samplers
def test_the_comparison_catches_a_wrong_temperature() -> None:
    logits = fixed_logits()
    ours = our_draws(logits, params(temperature=1.0), [])
    theirs = llama_cpp_draws(logits, params(temperature=0.8), [])
    assert same_distribution_z(ours, theirs) > 10


@pytest.mark.slow  # thousands of draws from both samplers
def test_the_comparison_catches_a_penalty_left_out() -> None:
    logits = fixed_logits()
    recent = [int(t) for t in np.argsort(-logits)[:8]]
    ours = our_draws(logits, params(repeat_penalty=1.5), [])
    theirs = llama_cpp_draws(logits, params(repeat_penalty=1.5), recent)
    assert same_distribution_z(ours, theirs) > 10


def test_a_seeded_draw_depends_only_on_its_seed_and_index() -> None:
    sampling = params(seed=5)
    alone = uniform([Row(sampling, 7)])
    among = uniform([Row(params(seed=9), 7), Row(sampling, 7), Row(sampling, 8)])
    assert alone[0] == among[1]
    assert among[1] != among[2]
    assert among[0] != among[1]


def test_greedy_with_a_penalty_picks_the_best_penalized_token() -> None:
    logits = np.array([[1.0, 5.0, 4.0, -1.0]], dtype=np.float32)
    row = Row(params(temperature=0.0, repeat_penalty=2.0), 0, recent=[1])
    assert sample_rows(logits, [row]) == [2]  # 5 / 2 falls below 4


def test_settings_llama_cpp_keeps() -> None:
    assert batchable(params())
    assert batchable(params(temperature=0.0, repeat_penalty=1.2))
    assert not batchable(params(top_k=0))  # the whole vocabulary
    assert not batchable(params(top_k=MAX_TOP_K + 1))
    assert not batchable(params(repeat_penalty=0.8))  # raises tokens from anywhere
    assert batchable(params(presence_penalty=1.0, frequency_penalty=0.5))
    assert not batchable(params(presence_penalty=-0.5))
    assert not batchable(params(frequency_penalty=-0.1))


def masked_logits(allowed_share: float, seed: int) -> np.ndarray:
    """Fixed logits with all but a share of the tokens ruled out, as a grammar does."""
    logits = fixed_logits(seed=seed)
    ruled_out = np.random.default_rng(seed + 1).random(VOCAB) >= allowed_share
    ruled_out[np.argmax(logits)] = allowed_share < 0.5  # a grammar often rules out the best
    logits[ruled_out] = -np.inf
    return logits


@pytest.mark.slow  # thousands of draws from both samplers
@pytest.mark.parametrize("allowed_share", [0.02, 0.5])
def test_a_masked_draw_gives_llama_cpps_distribution(allowed_share: float) -> None:
    logits = masked_logits(allowed_share, seed=4)
    sampling = params(temperature=1.1, top_k=30, min_p=0.0)
    allowed = np.flatnonzero(np.isfinite(logits)).astype(np.int32)
    ours: Counter[int] = Counter()
    for draw in range(DRAWS):
        token = draw_among(allowed, logits[allowed], -np.inf, Row(sampling, draw))
        assert token is not None
        ours[token] += 1
    theirs = llama_cpp_draws(logits, sampling, [])
    assert len(ours) >= 4
    assert set(ours) <= set(allowed.tolist())
    assert same_distribution_z(ours, theirs) < 4.5


@pytest.mark.slow  # thousands of draws from both samplers
def test_a_draw_among_the_best_is_the_draw_among_all_or_undecided() -> None:
    generator = np.random.default_rng(8)
    decided = 0
    for case in range(600):
        share = float(generator.choice([0.002, 0.02, 0.3, 1.0]))
        logits = masked_logits(share, seed=case)
        raw = fixed_logits(seed=case)  # before the mask: what decides which are the best
        sampling = params(
            temperature=float(generator.choice([0.0, 0.7, 1.5])),
            top_k=int(generator.choice([1, 10, 40])),
            top_p=float(generator.choice([1.0, 0.9, 0.5])),
            min_p=float(generator.choice([0.0, 0.1])),
            repeat_penalty=float(generator.choice([1.0, 1.5])),
            frequency_penalty=float(generator.choice([0.0, 0.6])),
        )
        row = Row(sampling, case, np.argsort(-raw)[:PENALTY_WINDOW:2].tolist())
        allowed = np.flatnonzero(np.isfinite(logits)).astype(np.int32)
        if not len(allowed):
            continue
        whole = draw_among(allowed, logits[allowed], -np.inf, row)
        width = int(generator.choice([16, 64, 256]))
        best = np.argpartition(raw, VOCAB - width)[VOCAB - width :].astype(np.int32)
        among_best = draw_among(best, logits[best], float(raw[best].min()), row)
        assert among_best in (None, whole)
        decided += among_best is not None
    assert decided > 300  # most are decided from the best alone


needs_sampler_c = pytest.mark.skipif(
    not native_sampler.available(), reason="sampler.c was not built (make install builds it)"
)


def nucleus(logits: np.ndarray, sampling: SamplingParams) -> set[int]:
    """The tokens top-p and min-p keep, by the definition: sorted, the fewest whose
    probability reaches top_p, then those within min_p of the best."""
    order = np.argsort(-logits, kind="stable")
    weights = np.exp(logits[order].astype(np.float64) - logits.max())
    reach = np.cumsum(weights) / weights.sum()
    kept = order[: int(np.searchsorted(reach, sampling.top_p)) + 1]
    floor = logits.max() + math.log(sampling.min_p) if sampling.min_p > 0 else -np.inf
    return {int(token) for token in kept if logits[token] >= floor}


@needs_sampler_c
def test_rows_without_top_k_are_drawn_by_sampler_c_and_never_by_llama_cpps_chain() -> None:
    assert drawn_from_whole_rows(params(top_k=0))
    assert not drawn_from_whole_rows(params(top_k=40))
    assert not drawn_from_whole_rows(params(top_k=0, temperature=0.0))  # greedy: top-1
    assert not drawn_from_whole_rows(params(top_k=0, repeat_penalty=0.9))  # raises tokens
    assert not batchable(params(top_k=0))  # not from the best candidates


@needs_sampler_c
def test_a_flat_vocabulary_draws_only_from_its_wide_nucleus() -> None:
    # Gemma's 262,144 tokens, nearly equally likely: top-p 0.95 keeps most of them.
    rng = np.random.default_rng(5)
    logits = (rng.standard_normal(262_144) * 0.05).astype(np.float32)
    sampling = params(top_k=0, top_p=0.95, min_p=0.0, temperature=1.0)
    kept = nucleus(logits, sampling)
    assert len(kept) > 200_000
    rows = [Row(sampling, draw) for draw in range(400)]
    drawn = sample_rows(np.tile(logits, (len(rows), 1)), rows)
    assert set(drawn) <= kept
    assert len(set(drawn)) > 350  # spread over the nucleus, not a few tokens


@needs_sampler_c
def test_tied_tokens_at_the_cut_are_kept_in_id_order_as_many_as_the_mass_needs() -> None:
    logits = np.full(64, -30.0, dtype=np.float32)
    logits[[3, 9, 17, 40]] = 5.0  # four equally likely tokens hold nearly all the mass
    sampling = params(top_k=0, top_p=0.45, min_p=0.0)  # two of them reach 0.45 of it
    rows = [Row(sampling, draw) for draw in range(300)]
    drawn = Counter(sample_rows(np.tile(logits, (len(rows), 1)), rows))
    assert set(drawn) == {3, 9}


@needs_sampler_c
def test_a_row_without_top_k_draws_the_same_alone_and_among_other_rows() -> None:
    logits = fixed_logits()
    whole = params(top_k=0, top_p=0.9, seed=21)
    alone = [sample_rows(logits[None, :], [Row(whole, draw)])[0] for draw in range(40)]
    others = [params(seed=4), params(temperature=0.0), params(top_k=0, seed=8)]
    among = []
    for draw in range(40):
        rows = [Row(others[0], draw), Row(whole, draw), Row(others[1], 0), Row(others[2], 1)]
        among.append(sample_rows(np.tile(logits, (len(rows), 1)), rows)[1])
    assert alone == among
    assert len(set(alone)) > 5
