"""A sequence with a sampler of its own (a grammar here) is drawn beside the step
(service/backends/llama_cpp/own_draws.py): while its draw runs, the model's other
streams go on decoding, and the draw's token arrives at a later step."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator, Sequence

import numpy as np
import pytest

from service.backends.base import Sampled, SequenceRequest
from service.backends.llama_cpp import sampling
from service.backends.llama_cpp.backend import LlamaCppBackend, LlamaCppOptions, LlamaSequence
from service.models.embedded import EMBEDDED_MODELS
from service.text.requests import Grammar, SamplingParams
from tests.conftest import SMOLLM

SAMPLED = SamplingParams(
    temperature=0.8, top_p=0.95, top_k=40, min_p=0.05, repeat_penalty=1.0, seed=3
)
YES_OR_NO = Grammar('root ::= ("yes" | "no") (" " ("yes" | "no"))*')


@pytest.fixture(scope="module")
def backend() -> Iterator[LlamaCppBackend]:
    path = EMBEDDED_MODELS[SMOLLM].locate()
    options = LlamaCppOptions(context_size=1024, threads=1, max_sequences=4, cached_sequences=0)
    loaded = LlamaCppBackend(path, options)
    yield loaded
    loaded.close()


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Grammar draws wait for this to be set: a draw as slow as the test wants."""
    opened = threading.Event()
    original = sampling.SamplerChain.sample

    def gated(chain: sampling.SamplerChain, logits: np.ndarray, recent: Sequence[int]) -> int:
        if chain._grammar is not None:
            assert opened.wait(timeout=60)
        return original(chain, logits, recent)

    monkeypatch.setattr(sampling.SamplerChain, "sample", gated)
    return opened


def start(backend: LlamaCppBackend, grammar: Grammar | None) -> LlamaSequence:
    prompt = tuple(backend.tokenize("Is the sky blue? Answer:", add_bos=backend.adds_bos))
    sequence = backend.start(SequenceRequest(prompt, SAMPLED, 64, grammar=grammar))
    assert isinstance(sequence, LlamaSequence)
    return sequence


def tokens_per_sequence(
    backend: LlamaCppBackend, sequences: list[LlamaSequence], steps: int
) -> list[list[Sampled]]:
    made: list[list[Sampled]] = [[] for _ in sequences]
    for _ in range(steps):
        for into, sampled in zip(made, backend.step(sequences, lambda: None), strict=True):
            if sampled is not None:
                into.append(sampled)
    return made


def test_the_others_decode_while_a_draw_of_its_own_runs(
    backend: LlamaCppBackend, gate: threading.Event
) -> None:
    constrained, *others = [start(backend, YES_OR_NO)] + [start(backend, None) for _ in range(2)]
    everyone = [constrained, *others]
    try:
        held = tokens_per_sequence(backend, everyone, 6)
        assert held[0] == []  # its draw is still waiting
        assert all(len(made) == 6 for made in held[1:])  # a token every step
        gate.set()
        later = tokens_per_sequence(backend, everyone, 6)
        assert later[0]  # the draw's token arrived, and the sequence went on
        text = b"".join(backend.token_bytes(s.token) for s in later[0]).decode()
        # What the grammar allows, cut anywhere: "yes no", "yes ", "yes n", "y".
        assert re.fullmatch(r"(yes|no)( (yes|no))*( (y|ye|n)?)?|y|ye|n", text)
        assert all(len(made) == 6 for made in later[1:])
    finally:
        gate.set()
        for sequence in everyone:
            backend.finish(sequence)


def test_finishing_a_sequence_waits_for_its_running_draw(
    backend: LlamaCppBackend, gate: threading.Event
) -> None:
    constrained, other = start(backend, YES_OR_NO), start(backend, None)
    tokens_per_sequence(backend, [constrained, other], 2)  # its draw now waits on the gate
    opener = threading.Timer(0.3, gate.set)
    opener.start()
    backend.finish(constrained)  # must not free the sampler under the draw
    opener.join()
    assert gate.is_set()
    assert len(tokens_per_sequence(backend, [other], 3)[0]) == 3
    backend.finish(other)
