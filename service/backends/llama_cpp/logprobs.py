"""Log-probabilities of a sampled token from a model's raw logits."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from service.text.requests import TokenLogprob, TopLogprob


def token_logprob(
    logits: npt.NDArray[np.float32],
    chosen: int,
    top: int,
    piece: Callable[[int], bytes],
) -> TokenLogprob:
    """The chosen token's log-probability and the `top` most likely tokens'.

    Probabilities are the model's own distribution (a softmax of its logits),
    before temperature, top-k/top-p or a grammar reshaped it for sampling, so
    they say how likely the model found each token, whatever was sampled.
    """
    shifted = logits.astype(np.float64) - float(np.max(logits))
    log_total = float(np.log(np.sum(np.exp(shifted))))
    alternatives: tuple[TopLogprob, ...] = ()
    if top > 0:
        best = np.argpartition(shifted, -top)[-top:]
        best = best[np.argsort(-shifted[best], kind="stable")]
        alternatives = tuple(
            TopLogprob(int(token), piece(int(token)), float(shifted[token]) - log_total)
            for token in best
        )
    return TokenLogprob(chosen, piece(chosen), float(shifted[chosen]) - log_total, alternatives)
