"""Row work gives the same answer whether it runs on one thread or several."""

from __future__ import annotations

import numpy as np
import pytest

from service.backends.batch_sampling import Row, sample_rows
from service.backends.row_threads import RowThreads
from service.text.requests import SamplingParams


@pytest.mark.parametrize(("rows", "vocab"), [(1, 50), (3, 1000), (37, 262144)])
@pytest.mark.parametrize("threads", [1, 4])
def test_each_row_gets_its_own_argmax(rows: int, vocab: int, threads: int) -> None:
    logits = np.random.default_rng(rows).standard_normal((rows, vocab), dtype=np.float32)
    work = RowThreads(threads)
    try:
        assert work.argmax(logits) == np.argmax(logits, axis=1).tolist()
    finally:
        work.close()


@pytest.mark.parametrize("threads", [1, 4])
def test_each_row_gets_its_own_draw(threads: int) -> None:
    logits = np.random.default_rng(5).standard_normal((37, 262144), dtype=np.float32) * 3
    params = SamplingParams(
        temperature=0.8, top_p=0.95, top_k=40, min_p=0.05, repeat_penalty=1.0, seed=3
    )
    rows = [Row(params, draw) for draw in range(37)]
    work = RowThreads(threads)
    try:
        assert work.sample(logits, rows) == sample_rows(logits, rows)
    finally:
        work.close()
