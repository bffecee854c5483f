"""A grammar is first applied to a row's best logits only (service/backends/llama_cpp/
sampling.py): the tokens must be exactly those of applying it to the whole vocabulary,
for greedy and seeded sampled requests alike, and the whole vocabulary must be needed
only now and then."""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import pytest

from service.backends.base import SequenceRequest
from service.backends.llama_cpp import sampling
from service.backends.llama_cpp.backend import LlamaCppBackend, LlamaCppOptions
from service.grammar.compile import resolve_grammar
from service.models.embedded import EMBEDDED_MODELS
from service.text.requests import Grammar, SamplingParams
from tests.conftest import SMOLLM

PERSON = json.dumps(
    {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "age": {"type": "integer"},
            "pets": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["name", "age", "pets"],
    }
)
# Only a few rare characters allowed: the best logits seldom hold enough of them.
RARE = 'root ::= [qxz]+ "!"'
SETTINGS = {
    "greedy": SamplingParams(
        temperature=0.0, top_p=1.0, top_k=0, min_p=0.0, repeat_penalty=1.0, seed=1
    ),
    "sampled": SamplingParams(
        temperature=0.9, top_p=0.95, top_k=40, min_p=0.02, repeat_penalty=1.0, seed=5
    ),
    "penalized": SamplingParams(
        temperature=0.7, top_p=0.9, top_k=20, min_p=0.0, repeat_penalty=1.3, seed=9
    ),
    "whole vocabulary": SamplingParams(
        temperature=0.8, top_p=0.95, top_k=0, min_p=0.05, repeat_penalty=1.0, seed=2
    ),
}


@pytest.fixture(scope="module")
def backend() -> Iterator[LlamaCppBackend]:
    path = EMBEDDED_MODELS[SMOLLM].locate()
    options = LlamaCppOptions(context_size=512, threads=1, max_sequences=2, cached_sequences=0)
    loaded = LlamaCppBackend(path, options)
    yield loaded
    loaded.close()


class WholeVocabularyCount:
    """Counts the grammar's applications to the whole vocabulary."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        original = sampling._GrammarGuard._apply

        def counted(
            guard: sampling._GrammarGuard, ids: np.ndarray, logits: np.ndarray, whole: bool = False
        ) -> object:
            self.count += whole
            return original(guard, ids, logits, whole)

        monkeypatch.setattr(sampling._GrammarGuard, "_apply", counted)


def generate(
    backend: LlamaCppBackend, params: SamplingParams, grammar: Grammar, tokens: int
) -> list[int]:
    prompt = tuple(backend.tokenize("A person, as JSON: ", add_bos=backend.adds_bos))
    sequence = backend.start(SequenceRequest(prompt, params, tokens, grammar=grammar))
    assert sequence is not None
    produced: list[int] = []
    try:
        while len(produced) < tokens:
            sampled = backend.step([sequence], lambda: None)[0]
            if sampled is not None:
                assert sampled.refused is None
                produced.append(sampled.token)
    finally:
        backend.finish(sequence)
    return produced


@pytest.mark.parametrize("settings", list(SETTINGS))
@pytest.mark.parametrize("constraint", ["json schema", "rare characters"])
def test_the_same_tokens_as_the_whole_vocabulary(
    backend: LlamaCppBackend, monkeypatch: pytest.MonkeyPatch, settings: str, constraint: str
) -> None:
    grammar = resolve_grammar(None, PERSON) if constraint == "json schema" else Grammar(RARE)
    assert grammar is not None
    params = SETTINGS[settings]
    whole = WholeVocabularyCount(monkeypatch)
    tokens = generate(backend, params, grammar, 24)
    first_tries = whole.count
    monkeypatch.setattr(sampling, "GRAMMAR_FIRST_TRIES", ())
    assert generate(backend, params, grammar, 24) == tokens
    assert whole.count - first_tries == 24  # every token checked against all of them
    if settings == "whole vocabulary":
        assert first_tries == 24  # top-k 0 draws from every allowed token
    elif constraint == "json schema":
        assert first_tries <= 2  # the best few hundred logits nearly always decide


class HiccupClock:
    """perf_counter for the sampling module: the first ruling seems to take 50 ms
    (the process was preempted), every later one 1 ms."""

    def __init__(self) -> None:
        self.now = 0.0
        self.calls = 0

    def perf_counter(self) -> float:
        self.calls += 1
        self.now += 0.05 if self.calls == 2 else 0.0005
        return self.now


def test_a_slow_moment_on_a_few_candidates_is_measured_on_all_not_refused(
    backend: LlamaCppBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 50 ms on 256 candidates would be 9.6 s on SmolLM2's 49,152 tokens: over the
    # limit if it were true, so the whole vocabulary is measured, and takes 1 ms.
    monkeypatch.setattr(sampling, "time", HiccupClock())
    whole = WholeVocabularyCount(monkeypatch)
    grammar = resolve_grammar(None, PERSON)
    assert grammar is not None
    assert len(generate(backend, SETTINGS["sampled"], grammar, 4)) == 4
    assert whole.count == 1
