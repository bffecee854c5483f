"""Prompt-lookup speculation in the llama.cpp backend (issue 47), on a real model.

At temperature 0 a step that verifies drafted tokens must give the tokens that
one-token steps give, while sequences leave the batch and others join it (the
rejected guesses' cells are dropped from a cache that other sequences share).

"The same tokens" holds up to llama.cpp's numerics: its logits depend on the
shape of the batch they were computed in (other sequences beside, a chunk of
five tokens against one), by up to 0.08 here, so where two tokens are that close
either run may take either, plain batched decoding included (the same prompts
decoded one at a time and three at a time part at such a tie). The check is
therefore against a reference: every token either run gives must be the argmax,
within `TIE`, of llama-cpp-python's own evaluation of the whole sequence. A
wrong row, a cell left behind or a stale guess misses it by whole logits.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import llama_cpp
import numpy as np
import pytest

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from service.backends.base import SequenceRequest
from service.backends.llama_cpp.backend import LlamaCppBackend, LlamaCppOptions, LlamaSequence
from service.backends.llama_cpp.speculation import draft_room, verified_run
from service.models.embedded import EMBEDDED_MODELS
from service.text.requests import SamplingParams
from tests.conftest import GEMMA, collect, finished_of, make_settings, serving, text_of

# Logits this close are a tie at llama.cpp's batch-shape noise (see above).
TIE = 0.25
GREEDY = SamplingParams(temperature=0.0, top_p=1.0, top_k=0, min_p=0.0, repeat_penalty=1.0, seed=1)

# Answers that repeat their input, where a lookup finds guesses, and one that does not.
PROMPTS = (
    "Copy the list exactly.\nList: red apple, green pear, yellow lemon, purple plum, "
    "orange peach.\nCopy: red apple, green pear,",
    "def add(a, b):\n    return a + b\n\n\ndef add_three(a, b, c):\n    return a + b",
    "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the",
    "Once upon a time, in a small village by the sea,",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15,",
)


def test_the_run_is_the_agreed_guesses_then_the_model_s_own_token() -> None:
    assert verified_run([5, 6, 7], [5, 6, 7, 8]) == [5, 6, 7, 8]  # all held, one more
    assert verified_run([5, 6, 7], [5, 9, 7, 8]) == [5, 9]  # the model's 9 replaces 6
    assert verified_run([5, 6, 7], [4, 6, 7, 8]) == [4]  # none held: one token, as always
    assert verified_run([], [3]) == [3]


def test_guesses_fit_the_cells_the_slot_reserved() -> None:
    assert draft_room(held_cells=10, reserved_cells=20, wanted=4) == 4
    assert draft_room(held_cells=17, reserved_cells=20, wanted=4) == 2  # 18 + 2 guesses = 20
    assert draft_room(held_cells=19, reserved_cells=20, wanted=4) == 0
    assert draft_room(held_cells=3, reserved_cells=None, wanted=4) == 0


@dataclass
class Decoded:
    tokens: list[list[int]]
    # Tokens that came in a step's run after its first: guesses the model agreed with.
    verified_extra: int = 0
    steps: int = 0
    cells_left: list[int] = field(default_factory=list)


def decode_all(backend: LlamaCppBackend, answers: list[int], together: int) -> Decoded:
    """Each prompt decoded for its answer length, `together` at a time: a sequence
    leaves when done and the next prompt joins the running ones."""
    queue = list(enumerate(answers))
    running: dict[LlamaSequence, int] = {}
    out = Decoded([[] for _ in answers])
    while queue or running:
        while queue and len(running) < together:
            index, length = queue.pop(0)
            text = PROMPTS[index % len(PROMPTS)]
            prompt = tuple(backend.tokenize(text, add_bos=backend.adds_bos))
            started = backend.start(SequenceRequest(prompt, GREEDY, length))
            assert started is not None
            running[started] = index
        sequences = list(running)
        out.steps += 1
        for sequence, sampled in zip(sequences, backend.step(sequences, lambda: None), strict=True):
            if sampled is None:
                continue
            made = out.tokens[running[sequence]]
            made.extend(each.token for each in sampled.run)
            out.verified_extra += len(sampled.more)
            if len(made) >= answers[running[sequence]]:
                del made[answers[running[sequence]] :]
                out.cells_left.append(len(sequence.slot.tokens))
                backend.finish(sequence)
                del running[sequence]
    return out


@pytest.fixture(scope="module", params=["unified", "per-sequence"])
def backends(request: pytest.FixtureRequest) -> Iterator[tuple[LlamaCppBackend, LlamaCppBackend]]:
    path = EMBEDDED_MODELS[GEMMA].locate()
    options = LlamaCppOptions(
        context_size=1024, threads=1, max_sequences=3, cached_sequences=1, kv_layout=request.param
    )
    plain = LlamaCppBackend(path, options)
    speculating = LlamaCppBackend(path, LlamaCppOptions(**{**vars(options), "draft_tokens": 4}))
    yield plain, speculating
    plain.close()
    speculating.close()


@pytest.fixture(scope="module")
def reference() -> Iterator[llama_cpp.Llama]:
    """llama-cpp-python's own evaluation, every position's logits kept."""
    path = EMBEDDED_MODELS[GEMMA].locate()
    model = llama_cpp.Llama(str(path), n_ctx=160, logits_all=True, n_threads=1, verbose=False)
    yield model
    model.close()


def largest_miss(
    reference: llama_cpp.Llama, decoded: list[list[int]], prompts: Sequence[str] = PROMPTS
) -> float:
    """How far below the reference's best logit any decoded token was; answer i
    followed prompts[i] (cycling, as decode_all's do)."""
    worst = 0.0
    for index, tokens in enumerate(decoded):
        prompt = reference.tokenize(prompts[index % len(prompts)].encode(), add_bos=True)
        reference.reset()
        reference.eval(prompt + tokens)
        for offset, token in enumerate(tokens):
            row = np.asarray(reference.scores[len(prompt) + offset - 1])
            worst = max(worst, float(row.max() - row[token]))
    return worst


def test_greedy_tokens_are_the_model_s_with_speculation_as_sequences_come_and_go(
    backends: tuple[LlamaCppBackend, LlamaCppBackend], reference: llama_cpp.Llama
) -> None:
    plain, speculating = backends
    answers = [30, 16, 36, 20, 24]
    without = decode_all(plain, answers, together=3)
    with_guesses = decode_all(speculating, answers, together=3)
    assert largest_miss(reference, without.tokens) < TIE
    assert largest_miss(reference, with_guesses.tokens) < TIE
    same = sum(a == b for a, b in zip(with_guesses.tokens, without.tokens, strict=True))
    assert same >= len(answers) - 2  # parting only at a tie
    assert without.verified_extra == 0
    # Guesses were made and held on these repeating answers, so fewer steps ran.
    assert with_guesses.verified_extra > 15
    assert with_guesses.steps < without.steps


def test_a_sequence_alone_gives_the_model_s_tokens_with_speculation(
    backends: tuple[LlamaCppBackend, LlamaCppBackend], reference: llama_cpp.Llama
) -> None:
    _, speculating = backends
    for answer in (1, 2, 7, 20):  # runs that end inside a verified run, and past it
        decoded = decode_all(speculating, [answer] * 3, 1)  # the three repeating prompts
        assert [len(tokens) for tokens in decoded.tokens] == [answer] * 3
        assert largest_miss(reference, decoded.tokens) < TIE


@pytest.fixture(scope="module")
def speculating_server() -> Iterator[pb_grpc.InferenceStub]:
    with serving(make_settings(default_model=GEMMA, draft_tokens=8)) as (_, stub):
        yield stub


def test_a_server_with_draft_tokens_streams_the_model_s_greedy_tokens(
    speculating_server: pb_grpc.InferenceStub, reference: llama_cpp.Llama
) -> None:
    prompts = [PROMPTS[0], PROMPTS[2], PROMPTS[4]]
    answers = []
    for text in prompts:
        prompt = reference.tokenize(text.encode(), add_bos=True)
        request = pb.GenerateRequest(prompt_token_ids=prompt, max_tokens=40, temperature=0)
        events = collect(speculating_server.Generate(request))
        tokens = [t for e in events if e.WhichOneof("event") == "delta" for t in e.delta.token_ids]
        assert finished_of(events).usage.completion_tokens == len(tokens) == 40
        answers.append(tokens)
    assert largest_miss(reference, answers, prompts) < TIE


def test_a_stop_sequence_inside_a_verified_run_ends_the_text_there(
    speculating_server: pb_grpc.InferenceStub,
) -> None:
    # The copy runs "... yellow lemon, purple plum, orange peach": guesses hold there.
    request = pb.GenerateRequest(prompt=PROMPTS[0], max_tokens=40, temperature=0, stop=["plum"])
    events = collect(speculating_server.Generate(request))
    text = text_of(events)
    assert finished_of(events).finish_reason == pb.FINISH_REASON_STOP_SEQUENCE
    assert "plum" not in text
    assert text.endswith("purple ")
