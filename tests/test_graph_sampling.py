"""Sampling inside llama.cpp's graph gives the tokens the host path gives (issue 39).

llama.cpp marks its backend-sampling API experimental, so what the service relies
on is pinned here, on the CPU, where ggml runs the same graph a GPU would: the
greedy token is the host's argmax of the same logits, a sampled draw from the
graph's candidates is the host's draw from the whole row (the same token for the
same seed, so the same distribution), rows that need the host path (a grammar,
logprobs) keep it in the same step, and sequences leaving and joining keep their
own paths, including the one case llama.cpp would otherwise get wrong (a path
changing in a step shaped exactly like the last one).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from service.backends.base import SequenceRequest
from service.backends.batch_sampling import Row, sample_from_candidates, sample_rows
from service.backends.llama_cpp import graph_sampling
from service.backends.llama_cpp.backend import LlamaCppBackend, LlamaCppOptions, LlamaSequence
from service.backends.names import top_candidates_in_graph
from service.backends.native import graph_sampler
from service.models.embedded import EMBEDDED_MODELS
from service.text.requests import Grammar, SamplingParams
from tests.conftest import SMOLLM

pytestmark = pytest.mark.skipif(
    not graph_sampler.available(),
    reason="graph_sampler.c was not built (python -m service.backends.native.build_graph_sampler)",
)

GREEDY = SamplingParams(temperature=0.0, top_p=1.0, top_k=0, min_p=0.0, repeat_penalty=1.0, seed=1)
SAMPLED = SamplingParams(
    temperature=0.8, top_p=0.95, top_k=40, min_p=0.05, repeat_penalty=1.1, seed=7
)
Request = tuple[str, SamplingParams, dict[str, Any]]


def _backend(sample_in_graph: str, sequences: int = 5) -> LlamaCppBackend:
    options = LlamaCppOptions(
        context_size=512,
        threads=2,
        max_sequences=sequences,
        cached_sequences=1,
        sample_in_graph=sample_in_graph,  # type: ignore[arg-type]
    )
    return LlamaCppBackend(EMBEDDED_MODELS[SMOLLM].locate(), options)


@pytest.fixture(scope="module")
def backends() -> Iterator[dict[str, LlamaCppBackend]]:
    both = {"graph": _backend("on"), "host": _backend("off")}
    yield both
    for backend in both.values():
        backend.close()


def _start(backend: LlamaCppBackend, request: Request, tokens: int) -> LlamaSequence:
    prompt, sampling, fields = request
    ids = tuple(backend.tokenize(prompt, add_bos=backend.adds_bos))
    sequence = backend.start(SequenceRequest(ids, sampling, tokens, **fields))
    assert isinstance(sequence, LlamaSequence)
    return sequence


def _decode(
    backend: LlamaCppBackend, requests: Sequence[Request], tokens: int
) -> tuple[list[list[int]], list[list[bool]]]:
    """The requests decoded together: each one's tokens, and which came from the graph."""
    sequences = [_start(backend, request, tokens) for request in requests]
    produced: list[list[int]] = [[] for _ in sequences]
    in_graph: list[list[bool]] = [[] for _ in sequences]
    while min(len(ids) for ids in produced) < tokens:
        for index, sampled in enumerate(backend.step(sequences, lambda: None)):
            if sampled is not None:
                produced[index].append(sampled.token)
                in_graph[index].append(sampled.in_graph)
    for sequence in sequences:
        backend.finish(sequence)
    return [ids[:tokens] for ids in produced], [flags[:tokens] for flags in in_graph]


MIXED: list[Request] = [
    ("The sky is", GREEDY, {}),
    ("Once upon a time", SAMPLED, {}),
    ("My favourite food is", replace(SAMPLED, seed=9, repeat_penalty=1.0), {}),
    ("Answer:", GREEDY, {"grammar": Grammar('root ::= "yes" | "no"')}),
    ("Water boils at", GREEDY, {"top_logprobs": 3}),
]


def test_a_mixed_step_gives_the_host_paths_tokens(backends: dict[str, LlamaCppBackend]) -> None:
    on_graph, flags = _decode(backends["graph"], MIXED, 12)
    on_host, host_flags = _decode(backends["host"], MIXED, 12)
    assert on_graph == on_host
    # Greedy and the two sampled rows were drawn in the graph; the grammar's and the
    # logprobs' rows on the host, in the same steps.
    assert [all(row) for row in flags] == [True, True, True, False, False]
    assert not any(any(row) for row in host_flags)
    grammar_text = b"".join(backends["graph"].token_bytes(t) for t in on_graph[3]).decode()
    assert grammar_text.startswith(("yes", "no"))


def test_sequences_leaving_and_joining_keep_their_own_paths(
    backends: dict[str, LlamaCppBackend],
) -> None:
    """A schedule of joins and leaves, the same on both: every request's tokens agree."""

    def schedule(backend: LlamaCppBackend) -> dict[str, list[int]]:
        plan = {  # name: (request, tokens, step it joins)
            "a": (("The sky is", GREEDY, {}), 6, 0),
            "b": (("Once upon a time", SAMPLED, {}), 10, 2),
            "c": (("Water boils at", GREEDY, {"top_logprobs": 2}), 4, 3),
            "d": (("My favourite food is", replace(SAMPLED, seed=3), {}), 5, 7),
            "e": (("The sky is", replace(SAMPLED, seed=5), {}), 4, 8),
        }
        running: dict[str, LlamaSequence] = {}
        produced: dict[str, list[int]] = {name: [] for name in plan}
        step = 0
        while step < 60 and (running or any(join >= step for _, _, join in plan.values())):
            for name, (request, tokens, join) in plan.items():
                if join == step:
                    running[name] = _start(backend, request, tokens)
            names = list(running)
            stepped = backend.step(list(running.values()), lambda: None)
            for name, sampled in zip(names, stepped, strict=True):
                if sampled is not None:
                    produced[name].append(sampled.token)
                if len(produced[name]) >= plan[name][1]:
                    backend.finish(running.pop(name))
            step += 1
        return produced

    assert schedule(backends["graph"]) == schedule(backends["host"])


def test_a_path_changing_in_a_step_shaped_like_the_last_is_not_served_a_stale_graph() -> None:
    """A greedy request ends; a sampled one takes its sequence id with a prompt cached
    but for its last token, in a step otherwise like the last: llama.cpp would reuse
    the greedy graph (an argmax where candidates are wanted) unless told otherwise."""
    results = {}
    for mode in ("on", "off"):
        backend = _backend(mode, sequences=1)
        try:
            first = _start(backend, ("The sky is", GREEDY, {}), 3)
            tokens: list[int] = []
            while len(tokens) < 3:
                sampled = backend.step([first], lambda: None)[0]
                if sampled is not None:
                    tokens.append(sampled.token)
            cached = list(first.slot.tokens)
            backend.finish(first)
            # Everything the first one evaluated, and its last token: one to evaluate.
            prompt = (*cached, tokens[-1])
            second = backend.start(SequenceRequest(prompt, SAMPLED, 1))
            assert isinstance(second, LlamaSequence)
            assert len(second.pending) == 1
            sampled = None
            while sampled is None:
                sampled = backend.step([second], lambda: None)[0]
            backend.finish(second)
            graph = backend._graph  # what the test is about
            results[mode] = (sampled.token, sampled.in_graph, graph.renewed if graph else 0)
        finally:
            backend.close()
    assert results["on"][0] == results["off"][0]
    assert results["on"][1:] == (True, 1)  # drawn in the graph, after renewing the sampler


def test_greedy_in_the_graph_is_the_argmax_of_the_same_logits() -> None:
    """Forty greedy prompts of different lengths, one step each, graph against host."""
    prompts = [" ".join(["word"] * (index % 7 + 1)) + f" {index}" for index in range(40)]
    tokens = {}
    for mode in ("on", "off"):
        backend = _backend(mode, sequences=8)
        try:
            tokens[mode] = [
                _decode(backend, [(prompt, GREEDY, {}) for prompt in prompts[i : i + 8]], 1)[0]
                for i in range(0, 40, 8)
            ]
        finally:
            backend.close()
    assert tokens["on"] == tokens["off"]


def _rows(rng: np.random.Generator, count: int) -> list[Row]:
    rows = []
    for draw in range(count):
        params = SamplingParams(
            temperature=float(rng.choice([0.0, 0.3, 0.8, 1.5])),
            top_p=float(rng.choice([1.0, 0.95, 0.5])),
            top_k=int(rng.choice([1, 10, 40, 64])),
            min_p=float(rng.choice([0.0, 0.05])),
            repeat_penalty=float(rng.choice([1.0, 1.3])),
            seed=int(rng.integers(0, 2**31)),
            presence_penalty=float(rng.choice([0.0, 0.5])),
            frequency_penalty=float(rng.choice([0.0, 0.2])),
        )
        recent = tuple(int(t) for t in rng.integers(0, 300, size=64))
        rows.append(Row(params, draw, recent))
    return rows


def test_a_draw_from_the_graphs_candidates_is_the_draw_from_the_whole_row() -> None:
    """4,000 draws over random logits and settings (penalties included): the candidates
    the graph gives (the row's GRAPH_TOP best, in no order) draw what the whole row
    draws, token for token."""
    rng = np.random.default_rng(39)
    logits = (rng.standard_normal((4000, 2048)) * 3).astype(np.float32)
    # Recent tokens among the best, so that the penalties move the ranking.
    logits[:, :300] += 4
    rows = _rows(rng, len(logits))
    whole = sample_rows(logits, rows)
    top = graph_sampling.GRAPH_TOP
    best = np.argpartition(-logits, top, axis=1)[:, :top]
    shuffled = rng.permuted(best, axis=1).astype(np.int32)
    values = np.take_along_axis(logits, shuffled, axis=1)
    assert sample_from_candidates(shuffled, values, rows) == whole


@pytest.mark.parametrize(
    ("setting", "sampled_path"), [("on", graph_sampling.TOP), ("auto", graph_sampling.HOST)]
)
def test_auto_draws_only_greedy_rows_in_the_graph(setting: str, sampled_path: int) -> None:
    """Measured on an H200, the graph's top-k made sampled decoding slower and its argmax
    made greedy decoding faster (docs/gpu.md): "auto" keeps sampled rows on the host,
    "on" takes both into the graph."""
    graph = graph_sampling.GraphSampling(
        2,
        top_candidates=top_candidates_in_graph(setting),  # type: ignore[arg-type]
    )
    try:
        greedy = graph_sampling.RowPath(True, True, GREEDY, logprobs=False)
        sampled = graph_sampling.RowPath(False, True, SAMPLED, logprobs=False)
        with_logprobs = graph_sampling.RowPath(True, True, GREEDY, logprobs=True)
        assert graph.mode(greedy) == graph_sampling.GREEDY
        assert graph.mode(sampled) == sampled_path
        assert graph.mode(with_logprobs) == graph_sampling.HOST
    finally:
        graph.close()


def test_rows_without_top_k_are_drawn_on_the_host_even_with_the_graph_on() -> None:
    """The graph finds a row's top-k candidates; a row without top-k reads the whole row."""
    graph = graph_sampling.GraphSampling(2, top_candidates=True)
    try:
        whole = graph_sampling.RowPath(False, True, replace(SAMPLED, top_k=0), logprobs=False)
        assert graph.mode(whole) == graph_sampling.HOST
    finally:
        graph.close()
