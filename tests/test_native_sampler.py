"""The C draw (service/backends/native/sampler.c) against the numpy draw it
replaces, token for token, and its top-k against a sort."""

from __future__ import annotations

import numpy as np
import pytest

from service.backends import batch_sampling
from service.backends.batch_sampling import (
    PENALTY_WINDOW,
    Row,
    best_blocks,
    candidates_in_blocks,
    sample_rows,
    sample_rows_in_numpy,
    uniform,
)
from service.backends.native import sampler
from service.backends.row_threads import RowThreads
from service.text.requests import SamplingParams

SHAPES = [
    (3, 50, 40),  # shorter rows than k chunks: offered whole
    (4, 1000, 1),
    (5, 262144, 40),  # Gemma's vocabulary
    (6, 128256, 200),  # Llama 3's
    (2, 49152 + 37, 1024),  # a tail past the last whole chunk, the widest k
]


# Every candidate weighs the same at this temperature.
FLAT = SamplingParams(temperature=1e30, top_p=1.0, top_k=1, min_p=0.0, repeat_penalty=1.0, seed=0)


def _logits(rows: int, vocab: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, vocab), dtype=np.float32) * 3


def _draw_indices_for_each_pick(k: int) -> np.ndarray:
    """For i < k, a draw index whose number (seed 0) lands in [i / k, (i + 1) / k)."""
    indices = np.arange(40 * k)
    numbers = uniform([Row(FLAT, int(draw)) for draw in indices])
    buckets = np.floor(numbers * k).astype(np.int64)
    first = {
        int(bucket): int(index) for bucket, index in zip(buckets[::-1], indices[::-1], strict=True)
    }
    return np.array([first[i] for i in range(k)])


def _flat_draws(logits: np.ndarray, k: int) -> np.ndarray:
    """Each row's k draws of numbers in [i / k, (i + 1) / k) for i < k, at a
    temperature so high that every kept candidate weighs the same: the row's k
    candidates, best first."""
    rows = logits.shape[0]
    settings = np.zeros((rows * k, sampler.SETTINGS))
    settings[:, sampler.TEMPERATURE] = FLAT.temperature
    settings[:, sampler.TOP_K] = k
    settings[:, sampler.TOP_P] = 1.0
    settings[:, sampler.REPEAT_PENALTY] = 1.0
    settings[:, sampler.DRAW] = np.tile(_draw_indices_for_each_pick(k), rows)
    draws = sampler.StepDraws(np.repeat(logits, k, axis=0), settings, None)
    draws.draw(0, rows * k)
    return draws.tokens.reshape(rows, k)


def test_the_library_was_built() -> None:
    # `make install` builds it (a C compiler is there: llama.cpp builds from source).
    assert sampler.available()


@pytest.mark.slow  # thousands of draws per shape
@pytest.mark.parametrize(("rows", "vocab", "k"), SHAPES)
def test_each_row_draws_from_its_k_largest(rows: int, vocab: int, k: int) -> None:
    logits = _logits(rows, vocab, vocab)
    k = min(k, vocab)
    best_first = np.argsort(-logits, axis=1, kind="stable")[:, :k]
    assert np.array_equal(_flat_draws(logits, k), best_first)


@pytest.mark.parametrize(("rows", "vocab", "k"), SHAPES)
def test_the_numpy_search_finds_the_k_largest(rows: int, vocab: int, k: int) -> None:
    logits = _logits(rows, vocab, vocab)
    ids, values = candidates_in_blocks(logits, best_blocks(logits, k), k)
    largest = np.sort(logits, axis=1)[:, -min(k, vocab) :]
    assert np.array_equal(np.sort(values, axis=1), largest)
    assert np.array_equal(np.take_along_axis(logits, ids, axis=1), values)


def _window(best: np.ndarray, generator: np.random.Generator) -> list[int]:
    """Recent tokens among a row's best, some of them more than once."""
    window: list[int] = generator.choice(best[:24], size=PENALTY_WINDOW).tolist()
    return window


def _random_settings(generator: np.random.Generator, draw: int) -> SamplingParams:
    return SamplingParams(
        temperature=float(generator.choice([0.0, 0.3, 0.8, 1.5])),
        top_p=float(generator.choice([1.0, 0.95, 0.5])),
        top_k=int(generator.choice([1, 5, 40, 200, 1024])),
        min_p=float(generator.choice([0.0, 0.05, 0.3])),
        repeat_penalty=float(generator.choice([1.0, 1.0, 1.3])),
        seed=draw,
        presence_penalty=float(generator.choice([0.0, 0.0, 0.8])),
        frequency_penalty=float(generator.choice([0.0, 0.0, 0.35])),
    )


@pytest.mark.slow  # thousands of draws, up to a 128k vocabulary
@pytest.mark.parametrize("vocab", [300, 49152, 128256])
def test_the_same_tokens_as_numpy_for_the_same_numbers(vocab: int) -> None:
    generator = np.random.default_rng(vocab)
    logits = _logits(200, vocab, vocab + 1)
    best = np.argsort(-logits, axis=1)[:, :PENALTY_WINDOW]
    rows = [
        Row(_random_settings(generator, i), i, _window(best[i], generator))
        for i in range(len(logits))
    ]
    draws = batch_sampling.native_draws(logits, rows)
    for begin in range(0, len(rows), 64):  # in blocks, as the row threads run it
        draws.draw(begin, min(begin + 64, len(rows)))
    assert draws.tokens.tolist() == sample_rows_in_numpy(logits, rows)
    assert len(set(draws.tokens.tolist())) > 100  # real draws, not the first candidate each time


def test_ties_masked_tokens_nans_and_a_strided_view() -> None:
    vocab = 65536
    logits = np.zeros((4, vocab), dtype=np.float32)
    logits[1] = -np.inf  # every token masked but three
    logits[1, [7, 40000, vocab - 1]] = [1.0, 2.0, 3.0]
    logits[2] = np.arange(vocab, dtype=np.float32)  # rising: every chunk beats the last
    logits[3] = np.nan  # a broken model: still a token in range
    draws = _flat_draws(logits, 40)
    assert len(set(draws[0].tolist())) == 40
    assert set(draws[1].tolist()) == {7, 40000, vocab - 1}  # never a masked one
    assert draws[2].tolist() == list(range(vocab - 1, vocab - 41, -1))
    assert set(draws[3].tolist()) == {0}
    wide = _logits(4, 2 * vocab, 1)
    view = wide[:, ::2]  # columns not adjacent: copied first
    assert np.array_equal(_flat_draws(view, 40), np.argsort(-view, axis=1)[:, :40])


def test_row_threads_draw_the_same_without_the_library(monkeypatch: pytest.MonkeyPatch) -> None:
    logits = _logits(37, 262144, 5)
    params = SamplingParams(
        temperature=0.8, top_p=0.95, top_k=40, min_p=0.05, repeat_penalty=1.0, seed=3
    )
    rows = [Row(params, draw) for draw in range(37)]
    with_library = sample_rows(logits, rows)
    monkeypatch.setattr(sampler, "available", lambda: False)
    work = RowThreads(4)
    try:
        assert work.sample(logits, rows) == with_library
    finally:
        work.close()


@pytest.mark.parametrize(("rows", "vocab", "k"), SHAPES)
def test_one_rows_k_largest_in_c_and_in_numpy(
    rows: int, vocab: int, k: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    line = _logits(1, vocab, vocab + rows)[0]
    largest = np.sort(line)[-min(k, vocab) :]
    in_c = batch_sampling.best_of_row(line, k)
    monkeypatch.setattr(sampler, "available", lambda: False)
    in_numpy = batch_sampling.best_of_row(line, k)
    for ids, values in (in_c, in_numpy):
        assert np.array_equal(np.sort(values), largest)
        assert np.array_equal(line[ids], values)
