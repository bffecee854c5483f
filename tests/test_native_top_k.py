"""The C top-k (service/backends/native/top_k.c) against a sort, and the numpy search
it replaces against the same sort."""

from __future__ import annotations

import numpy as np
import pytest

from service.backends.batch_sampling import Row, best_blocks, candidates_in_blocks, sample_rows
from service.backends.native import top_k
from service.backends.row_threads import RowThreads
from service.text.requests import SamplingParams

SHAPES = [
    (3, 50, 40),  # shorter rows than k chunks: offered whole
    (4, 1000, 1),
    (5, 262144, 40),  # Gemma's vocabulary
    (6, 128256, 104),  # Llama 3's, with the penalty window's width
    (2, 49152 + 37, 1088),  # a tail past the last whole chunk, the widest k
]


def _largest(logits: np.ndarray, k: int) -> np.ndarray:
    return np.sort(logits, axis=1)[:, -min(k, logits.shape[1]) :]


def test_the_library_was_built() -> None:
    # `make install` builds it (a C compiler is there: llama.cpp builds from source).
    assert top_k.available()


@pytest.mark.parametrize(("rows", "vocab", "k"), SHAPES)
def test_each_row_gets_its_k_largest(rows: int, vocab: int, k: int) -> None:
    logits = np.random.default_rng(vocab).standard_normal((rows, vocab), dtype=np.float32) * 3
    ids, values = top_k.top_k_rows(logits, k)
    assert np.array_equal(np.sort(values, axis=1), _largest(logits, k))
    assert np.array_equal(np.take_along_axis(logits, ids, axis=1), values)
    assert all(len(set(row)) == ids.shape[1] for row in ids.tolist())


@pytest.mark.parametrize(("rows", "vocab", "k"), SHAPES)
def test_the_numpy_search_finds_the_same(rows: int, vocab: int, k: int) -> None:
    logits = np.random.default_rng(vocab).standard_normal((rows, vocab), dtype=np.float32) * 3
    ids, values = candidates_in_blocks(logits, best_blocks(logits, k), k)
    assert np.array_equal(np.sort(values, axis=1), _largest(logits, k))
    assert np.array_equal(np.take_along_axis(logits, ids, axis=1), values)


def test_ties_masked_tokens_and_a_strided_view() -> None:
    vocab = 65536
    logits = np.zeros((3, vocab), dtype=np.float32)
    logits[1] = -np.inf  # every token masked but three
    logits[1, [7, 40000, vocab - 1]] = [1.0, 2.0, 3.0]
    logits[2] = np.arange(vocab, dtype=np.float32)  # rising: every chunk beats the last
    ids, values = top_k.top_k_rows(logits, 40)
    assert len(set(ids[0].tolist())) == 40
    assert not values[0].any()
    assert set(ids[1][values[1] > -np.inf].tolist()) == {7, 40000, vocab - 1}
    assert sorted(ids[2].tolist()) == list(range(vocab - 40, vocab))
    wide = np.random.default_rng(1).standard_normal((4, 2 * vocab), dtype=np.float32)
    ids, values = top_k.top_k_rows(wide[:, ::2], 40)  # columns not adjacent: copied first
    assert np.array_equal(np.sort(values, axis=1), _largest(wide[:, ::2], 40))


def test_row_threads_draw_the_same_without_the_library(monkeypatch: pytest.MonkeyPatch) -> None:
    logits = np.random.default_rng(5).standard_normal((37, 262144), dtype=np.float32) * 3
    params = SamplingParams(
        temperature=0.8, top_p=0.95, top_k=40, min_p=0.05, repeat_penalty=1.0, seed=3
    )
    rows = [Row(params, draw) for draw in range(37)]
    with_library = sample_rows(logits, rows)
    monkeypatch.setattr(top_k, "available", lambda: False)
    work = RowThreads(4)
    try:
        assert work.sample(logits, rows) == with_library
    finally:
        work.close()
