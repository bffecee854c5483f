"""The batch argmax gives numpy's answer whether it runs on one thread or several."""

from __future__ import annotations

import numpy as np
import pytest

from service.backends.llama_cpp.argmax import RowArgmax


@pytest.mark.parametrize(("rows", "vocab"), [(1, 50), (3, 1000), (37, 262144)])
@pytest.mark.parametrize("threads", [1, 4])
def test_each_row_gets_its_own_argmax(rows: int, vocab: int, threads: int) -> None:
    logits = np.random.default_rng(rows).standard_normal((rows, vocab), dtype=np.float32)
    argmax = RowArgmax(threads)
    try:
        assert argmax.rows(logits) == np.argmax(logits, axis=1).tolist()
    finally:
        argmax.close()
