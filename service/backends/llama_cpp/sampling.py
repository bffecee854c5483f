"""A sequence's own sampler, for what the batched sampler
(service.backends.batch_sampling) does not do alone: a grammar (whose allowed
tokens the batched sampler's rules then draw from), and settings only a
llama.cpp chain handles (top-k of 0 or past 1,024, penalties that raise logits).

A logit bias (OpenAI's logit_bias) is always the chain's: llama.cpp's
logit-bias sampler comes first, as in llama.cpp's own common sampler, so a
bias of -100 rules a token out and +100 makes it all but certain, greedy or not.

Each such sequence in a batch samples on its own: its own parameters, its own
random generator, its own repetition history and grammar state, from a copy of
its logits on a thread beside the step (service/backends/llama_cpp/own_draws.py).
A chain is created when the sequence starts and freed when it finishes. Its order
follows llama-cpp-python's own: penalties, grammar, then the truncations and the
draw (or greedy at temperature 0).

A grammar is applied apart from the chain, and checked before anything is
drawn. Applying it to the whole vocabulary is what costs (about 45 ms a token
for Gemma's 262k tokens on a laptop core, which every other stream of the step
waits for), so it is first applied to the row's best few hundred logits, and
that is kept when it provably picks what the whole vocabulary would (see
`_GrammarGuard.decides`); only otherwise is the whole vocabulary checked.

llama.cpp's own `llama_sampler_sample` draws even when the grammar has ruled
out every token of the vocabulary (a grammar that demands an
end-of-generation token, or a text no token can write), and then aborts the
whole process when the grammar is told of the draw. Here such a sequence ends
with INVALID_ARGUMENT instead, as does one whose grammar has grown too costly
to apply (ambiguous grammars can double their work with every token, stalling
every other stream of the model).
"""

from __future__ import annotations

import ctypes
import re
import time
from collections.abc import Sequence
from typing import cast

import llama_cpp
import numpy as np
import numpy.typing as npt

from service.backends.batch_sampling import (
    PENALTY_WINDOW,
    Row,
    batchable,
    best_of_row,
    draw_among,
    drawn_from_whole_rows,
    row_candidates,
)
from service.backends.llama_cpp.log import captured_parser_output
from service.errors import InvalidRequest
from service.text.requests import Grammar, SamplingParams

# A token given by its id in a grammar: <[1234]>, or !<[1234]> for "any but".
_TOKEN_ID = re.compile(r"<\[(\d+)\]>")

# llama.cpp checks every parser stack of a grammar against every token of the
# vocabulary, for each token sampled: a grammar whose widest point times the
# vocabulary passes this is refused when its sequence starts (an enum of 1,000
# names on Gemma's 262k vocabulary would cost about 3 s a token on a laptop core).
MAX_GRAMMAR_CHECKS_PER_TOKEN = 64_000_000
# The longest one grammar may take to rule on one token's candidates: past it the
# sequence ends, so that the others of its model are not held up for long. Only a
# grammar whose alternatives multiply as it goes gets there, which no static
# bound can see.
GRAMMAR_STEP_SECONDS = 2.0

# How many of a row's best logits a grammar is tried on before the whole vocabulary.
GRAMMAR_FIRST_TRIES = (256, 8192)

Logits = npt.NDArray[np.float32]

# llama_token_data, as numpy lays it out: the candidates handed to llama.cpp.
_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


class SamplingRefused(InvalidRequest):
    """This sequence's grammar cannot go on: it alone ends, with this error."""


class SamplerChain:
    """A llama.cpp sampler chain; not thread-safe, freed with `close`."""

    def __init__(
        self,
        params: SamplingParams,
        history: Sequence[int],
        vocab: llama_cpp.llama_vocab_p,
        grammar: Grammar | None = None,
    ) -> None:
        # Plain greedy decoding is an argmax, which the backend takes for every such
        # sequence of a step in one numpy call; llama.cpp's chain would first copy the
        # whole vocabulary into a candidate array (a third of a millisecond per token
        # for Gemma's 262k entries).
        self.plain_greedy = (
            params.temperature == 0
            and not params.penalized
            and not grammar
            and not params.logit_bias
        )
        # Without a grammar, the common settings are sampled for the whole step at once
        # (service.backends.batch_sampling), and this chain is never built. With one,
        # they are drawn the same way from the candidates the grammar allows.
        self.batched = (
            not self.plain_greedy
            and grammar is None
            and (batchable(params) or drawn_from_whole_rows(params))
        )
        self.params = params
        self.draws = 0  # tokens drawn so far: the batched sampler's counter
        self._grammar = None if grammar is None else _GrammarGuard(vocab, grammar)
        self._chain: llama_cpp.llama_sampler_p | None = None
        # The chain's candidate buffer and their ids, when there is no grammar's.
        self._whole: tuple[npt.NDArray[np.void], npt.NDArray[np.int32]] | None = None
        if self.batched or batchable(params):  # plain greedy, batched, or a grammar's
            return
        self._chain = llama_cpp.llama_sampler_chain_init(
            llama_cpp.llama_sampler_chain_default_params()
        )
        if params.logit_bias:
            self._add(_logit_bias(params.logit_bias, llama_cpp.llama_vocab_n_tokens(vocab)))
        if params.penalized:
            self._add(_penalties(params, history, llama_cpp.llama_vocab_n_tokens(vocab)))
        if params.temperature == 0:
            self._add(llama_cpp.llama_sampler_init_greedy())
            return
        self._add(llama_cpp.llama_sampler_init_top_k(params.top_k))
        self._add(llama_cpp.llama_sampler_init_top_p(params.top_p, 1))
        self._add(llama_cpp.llama_sampler_init_min_p(params.min_p, 1))
        self._add(llama_cpp.llama_sampler_init_temp(params.temperature))
        self._add(llama_cpp.llama_sampler_init_dist(params.seed))

    def next_draw(self, recent: Sequence[int]) -> Row:
        """The batched sampler's view of this sequence's next draw (and counts it);
        `recent` ends with the sequence's latest tokens, prompt included."""
        window = recent[-PENALTY_WINDOW:] if self.params.penalized else ()
        row = Row(self.params, self.draws, window)
        self.draws += 1
        return row

    def sample(self, logits: Logits, recent: Sequence[int]) -> int:
        """Sample from one row of logits (a copy: the backend calls this off its own
        thread, while the model computes the next step), and remember the choice;
        `recent` as for `next_draw`.

        Raises SamplingRefused when the grammar rules out every token, or takes
        too long to rule.
        """
        if self._chain is None:
            assert self._grammar is not None, "greedy and batched rows are drawn per step"
            token = self._grammar.draw(logits, self.next_draw(recent))
            self._grammar.accept(token)
            return token
        if self._grammar is not None:
            candidates = self._grammar.whole_vocabulary(logits)
        else:
            if self._whole is None:
                size = len(logits)
                self._whole = np.zeros(size, dtype=_TOKEN_DATA), np.arange(size, dtype=np.int32)
            candidates = _token_data(*self._whole, logits)
        llama_cpp.llama_sampler_apply(self._chain, ctypes.byref(candidates))
        if not 0 <= candidates.selected < candidates.size:
            raise SamplingRefused("the sampler chose no token the grammar allows")
        token = int(candidates.data[candidates.selected].id)
        if self._grammar is not None:
            self._grammar.accept(token)
        llama_cpp.llama_sampler_accept(self._chain, token)
        return token

    def close(self) -> None:
        if self._chain is not None:
            llama_cpp.llama_sampler_free(self._chain)  # frees the samplers it holds
            self._chain = None
        if self._grammar is not None:
            self._grammar.close()
            self._grammar = None

    def _add(self, sampler: llama_cpp.llama_sampler_p) -> None:
        llama_cpp.llama_sampler_chain_add(self._chain, sampler)


class _GrammarGuard:
    """A grammar sampler of one sequence, applied to the vocabulary and checked."""

    def __init__(self, vocab: llama_cpp.llama_vocab_p, grammar: Grammar) -> None:
        size = llama_cpp.llama_vocab_n_tokens(vocab)
        _check_cost(grammar, size)
        self._sampler = _grammar(vocab, grammar.text)
        self._vocab = vocab
        self._ids = np.arange(size, dtype=np.int32)
        self._candidates = np.zeros(size, dtype=_TOKEN_DATA)
        self._tokens = 0
        self._on_pace = True  # whether the last ruling kept within GRAMMAR_STEP_SECONDS

    def draw(self, logits: Logits, row: Row) -> int:
        """The batched sampler's draw (service.backends.batch_sampling) among the tokens
        the grammar allows: tried on the row's best logits first, and on the whole
        vocabulary only when those cannot decide it.
        SamplingRefused when the grammar allows no token, or took too long to rule."""
        for width in GRAMMAR_FIRST_TRIES:
            if width < len(logits):
                ids, values = best_of_row(logits, width)
                self._apply(ids, values)
                if not self._on_pace:
                    break  # measure the whole vocabulary (see _check_pace)
                masked = self._candidates["logit"][: len(ids)]
                token = draw_among(ids, masked, float(values.min()), row)
                if token is not None:
                    return token
        self._apply(self._ids, logits, whole=True)
        masked = self._candidates["logit"]
        # The allowed tokens' best: sorting every allowed one (most of the vocabulary
        # inside a JSON string) would cost as much again as the grammar's ruling.
        ids, values = best_of_row(masked, row_candidates(row.params))
        token = draw_among(ids, values, float(values.min()), row)
        if token is None:
            allowed = np.flatnonzero(np.isfinite(masked)).astype(np.int32)
            token = draw_among(allowed, masked[allowed], -np.inf, row)
        assert token is not None, "the grammar allows a token: _apply checked"
        return token

    def whole_vocabulary(self, logits: Logits) -> llama_cpp.llama_token_data_array:
        """The vocabulary with the model's logits, every token the grammar rules out at
        -inf, for the chain. SamplingRefused as for `draw`."""
        return self._apply(self._ids, logits, whole=True)

    def _apply(
        self, ids: npt.NDArray[np.int32], logits: npt.NDArray[np.float32], whole: bool = False
    ) -> llama_cpp.llama_token_data_array:
        size = len(ids)
        candidates = self._candidates[:size]
        array = _token_data(candidates, ids, logits)
        started = time.perf_counter()
        llama_cpp.llama_sampler_apply(self._sampler, ctypes.byref(array))
        self._on_pace = self._check_pace(time.perf_counter() - started, size)
        if whole and not np.isfinite(candidates["logit"]).any():
            raise SamplingRefused(
                f"the grammar allows no token of this model's vocabulary after "
                f"{self._tokens} generated tokens (it may demand an end-of-generation "
                "token, or text no token can write)"
            )
        return array

    def _check_pace(self, seconds: float, size: int) -> bool:
        """Whether ruling on `size` candidates in `seconds` keeps the grammar within
        GRAMMAR_STEP_SECONDS for the whole vocabulary; refused when it was the whole
        vocabulary that took too long.

        A grammar whose work doubles with each token must be stopped at the same point
        whether it rules on a few candidates or on all of them, before its states
        (which accepting a token also walks) outgrow memory. A few candidates' time
        scaled up to the vocabulary says when; but scaled up, a moment's preemption
        looks a thousand times longer, so the caller then measures the whole
        vocabulary instead of trusting the estimate."""
        vocabulary = len(self._ids)
        if seconds * vocabulary / size <= GRAMMAR_STEP_SECONDS:
            return True
        if size < vocabulary:
            return False
        raise SamplingRefused(
            f"the grammar took {seconds:.1f} s to rule on token {self._tokens + 1}, more "
            f"than this server allows ({GRAMMAR_STEP_SECONDS:g} s): it is too ambiguous "
            "(its alternatives multiply with each token); simplify it"
        )

    def accept(self, token: int) -> None:
        self._tokens += 1
        llama_cpp.llama_sampler_accept(self._sampler, token)

    def close(self) -> None:
        llama_cpp.llama_sampler_free(self._sampler)


def _token_data(
    buffer: npt.NDArray[np.void], ids: npt.NDArray[np.int32], logits: Logits
) -> llama_cpp.llama_token_data_array:
    """The candidates `ids` with their `logits`, written to `buffer` (llama_token_data
    entries) and described for llama.cpp's samplers."""
    buffer["id"] = ids  # a chain sorts them, so they are written again each time
    buffer["logit"] = logits
    buffer["p"] = 0.0
    return llama_cpp.llama_token_data_array(
        data=buffer.ctypes.data_as(llama_cpp.llama_token_data_p),
        size=len(ids),
        selected=-1,
        sorted=False,
    )


def _check_cost(grammar: Grammar, vocabulary: int) -> None:
    checks = grammar.branches * vocabulary
    if checks > MAX_GRAMMAR_CHECKS_PER_TOKEN:
        raise InvalidRequest(
            f"the grammar can branch {grammar.branches} ways at one point; with this "
            f"model's {vocabulary} tokens that is {checks} checks per token sampled, more "
            f"than this server allows ({MAX_GRAMMAR_CHECKS_PER_TOKEN}): use fewer "
            "alternatives (a smaller enum, anyOf or oneOf) or a model with a smaller "
            "vocabulary"
        )


def _grammar(vocab: llama_cpp.llama_vocab_p, grammar: str) -> llama_cpp.llama_sampler_p:
    _check_token_ids(vocab, grammar)
    with captured_parser_output():
        sampler = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode("utf-8"), b"root")
    if not sampler:
        # The text parsed before the request was queued (service.grammar.compile), so
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


def _logit_bias(biases: Sequence[tuple[int, float]], n_vocab: int) -> llama_cpp.llama_sampler_p:
    """llama.cpp's logit-bias sampler; it copies the biases it is given."""
    entries = (llama_cpp.llama_logit_bias * len(biases))(
        *(llama_cpp.llama_logit_bias(token, bias) for token, bias in biases)
    )
    sampler = llama_cpp.llama_sampler_init_logit_bias(n_vocab, len(biases), entries)
    return cast("llama_cpp.llama_sampler_p", sampler)


def _penalties(
    params: SamplingParams, history: Sequence[int], n_vocab: int
) -> llama_cpp.llama_sampler_p:
    sampler = llama_cpp.llama_sampler_init_penalties(
        n_vocab,
        PENALTY_WINDOW,
        params.repeat_penalty,
        params.frequency_penalty,
        params.presence_penalty,
    )
    for token in history[-PENALTY_WINDOW:]:  # the prompt counts as recent text
        llama_cpp.llama_sampler_accept(sampler, token)
    return cast("llama_cpp.llama_sampler_p", sampler)
