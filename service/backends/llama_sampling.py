"""One llama.cpp sampler chain per sequence.

Each sequence in a batch samples on its own: its own parameters, its own
random generator seeded from the request, its own repetition history and
grammar state. A chain is created when the sequence starts and freed when it
finishes. The order follows llama-cpp-python's own: penalties, grammar, then
the truncations and the draw (or greedy at temperature 0).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import cast

import llama_cpp

from service.errors import InvalidRequest
from service.generation import SamplingParams

# A token given by its id in a grammar: <[1234]>, or !<[1234]> for "any but".
_TOKEN_ID = re.compile(r"<\[(\d+)\]>")

# How many recent tokens the repetition penalty looks at (llama.cpp's default).
PENALTY_WINDOW = 64


class SamplerChain:
    """A llama.cpp sampler chain; not thread-safe, freed with `close`."""

    def __init__(
        self,
        params: SamplingParams,
        history: Sequence[int],
        vocab: llama_cpp.llama_vocab_p,
        grammar: str | None = None,
    ) -> None:
        constraint = None if grammar is None else _grammar(vocab, grammar)
        # Plain greedy decoding is an argmax, which the backend takes for every such
        # sequence of a step in one numpy call; llama.cpp's chain would first copy the
        # whole vocabulary into a candidate array (a third of a millisecond per token
        # for Gemma's 262k entries).
        self.plain_greedy = params.temperature == 0 and params.repeat_penalty == 1.0 and not grammar
        self._chain = llama_cpp.llama_sampler_chain_init(
            llama_cpp.llama_sampler_chain_default_params()
        )
        if params.repeat_penalty != 1.0:
            n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
            self._add(_penalties(params.repeat_penalty, history, n_vocab))
        if constraint is not None:
            self._add(constraint)
        if params.temperature == 0:
            self._add(llama_cpp.llama_sampler_init_greedy())
            return
        self._add(llama_cpp.llama_sampler_init_top_k(params.top_k))
        self._add(llama_cpp.llama_sampler_init_top_p(params.top_p, 1))
        self._add(llama_cpp.llama_sampler_init_min_p(params.min_p, 1))
        self._add(llama_cpp.llama_sampler_init_temp(params.temperature))
        self._add(llama_cpp.llama_sampler_init_dist(params.seed))

    def sample(self, context: llama_cpp.llama_context_p, output_index: int) -> int:
        """Sample from the logits of batch output `output_index`, and remember the choice."""
        return int(llama_cpp.llama_sampler_sample(self._chain, context, output_index))

    def close(self) -> None:
        if self._chain is not None:
            llama_cpp.llama_sampler_free(self._chain)  # frees the samplers it holds
            self._chain = None

    def _add(self, sampler: llama_cpp.llama_sampler_p) -> None:
        llama_cpp.llama_sampler_chain_add(self._chain, sampler)


def _grammar(vocab: llama_cpp.llama_vocab_p, grammar: str) -> llama_cpp.llama_sampler_p:
    _check_token_ids(vocab, grammar)
    sampler = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode("utf-8"), b"root")
    if not sampler:
        # The text parsed before the request was queued (service.decode.grammar), so
        # what fails here is a token reference (<think>, <[1234]>) this vocabulary lacks.
        raise InvalidRequest(
            "the grammar refers to tokens this model's vocabulary does not have; "
            "llama.cpp's log names them"
        )
    return cast("llama_cpp.llama_sampler_p", sampler)


def _check_token_ids(vocab: llama_cpp.llama_vocab_p, grammar: str) -> None:
    """Refuse token ids (`<[N]>`) beyond the vocabulary.

    llama.cpp accepts them, and a grammar that no token can satisfy then makes
    the sampler abort the whole process at the first end-of-generation token.
    """
    size = llama_cpp.llama_vocab_n_tokens(vocab)
    for match in _TOKEN_ID.finditer(grammar):
        if int(match.group(1)) >= size:
            raise InvalidRequest(
                f"the grammar refers to token id {match.group(1)}; this model's "
                f"vocabulary has ids 0 to {size - 1}"
            )


def _penalties(
    repeat_penalty: float, history: Sequence[int], n_vocab: int
) -> llama_cpp.llama_sampler_p:
    sampler = llama_cpp.llama_sampler_init_penalties(
        n_vocab, PENALTY_WINDOW, repeat_penalty, 0.0, 0.0
    )
    for token in history[-PENALTY_WINDOW:]:  # the prompt counts as recent text
        llama_cpp.llama_sampler_accept(sampler, token)
    return cast("llama_cpp.llama_sampler_p", sampler)
