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
import numpy.typing as npt
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


def _backend(sample_in_graph: str, sequences: int = 5, cached: int = 1) -> LlamaCppBackend:
    options = LlamaCppOptions(
        context_size=512,
        threads=2,
        max_sequences=sequences,
        cached_sequences=cached,
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


@pytest.mark.parametrize("setting", ["on", "auto"])
def test_rows_without_top_k_or_penalties_are_drawn_whole_in_the_graph(setting: str) -> None:
    """The graph's whole-row draw (ROW) takes rows without top-k or penalties at a
    temperature up to 1 and a top_p of at least ROW_LEAST_TOP_P; the rest of the rows
    without top-k stay on the host, where sampler.c reads the whole row."""
    graph = graph_sampling.GraphSampling(
        2,
        top_candidates=top_candidates_in_graph(setting),  # type: ignore[arg-type]
    )
    whole = replace(SAMPLED, top_k=0, repeat_penalty=1.0)
    try:

        def mode(params: SamplingParams) -> int:
            return graph.mode(graph_sampling.RowPath(False, True, params, logprobs=False))

        assert mode(whole) == graph_sampling.ROW
        assert mode(replace(whole, top_p=1.0, min_p=0.0, temperature=1.0)) == graph_sampling.ROW
        assert mode(replace(whole, temperature=1.5)) == graph_sampling.HOST
        assert mode(replace(whole, top_p=0.5)) == graph_sampling.HOST
        assert mode(replace(whole, repeat_penalty=1.1)) == graph_sampling.HOST
        assert mode(replace(whole, presence_penalty=0.5)) == graph_sampling.HOST
        with_logprobs = graph_sampling.RowPath(False, True, whole, logprobs=True)
        assert graph.mode(with_logprobs) == graph_sampling.HOST
    finally:
        graph.close()


def _kept_distribution(
    logits: npt.NDArray[np.float32], params: SamplingParams
) -> npt.NDArray[np.float64]:
    """What sampler.c's whole-row draw keeps and with what chance: top-p and min-p at
    temperature 1, then softmax(logit / temperature) over the kept tokens."""
    best = float(logits.max())
    weights = np.exp(logits.astype(np.float64) - best)
    order = np.argsort(-logits, kind="stable")
    running = np.cumsum(weights[order]) / weights.sum()
    kept = np.zeros(len(logits), dtype=bool)
    kept[order[: int(np.searchsorted(running, params.top_p)) + 1]] = True
    if params.min_p > 0:
        kept &= logits >= best + np.log(params.min_p)
    chances = np.where(kept, np.exp((logits.astype(np.float64) - best) / params.temperature), 0)
    normalized: npt.NDArray[np.float64] = chances / chances.sum()
    return normalized


WHOLE = SamplingParams(temperature=0.8, top_p=0.95, top_k=0, min_p=0.0, repeat_penalty=1.0, seed=3)


@pytest.mark.parametrize(
    ("shape", "params"),
    [
        ("peaked", WHOLE),
        ("peaked", replace(WHOLE, min_p=0.05, top_p=0.9, temperature=0.6)),
        ("flat", WHOLE),
        ("flat", replace(WHOLE, top_p=0.8, temperature=1.0)),
        ("peaked", replace(WHOLE, top_p=1.0, min_p=0.1)),
    ],
)
def test_the_graphs_whole_row_draw_follows_the_kept_tokens_chances(
    shape: str, params: SamplingParams
) -> None:
    """20,000 draws of one row by the graph's own operations (ggml on the CPU, one
    thread, beside the other tests' servers): never
    a token top-p or min-p drops, and each kept token as often as its chance (a
    chi-square test at about one in a million). A flat row is where top-p keeps most
    of the vocabulary and the draw's rounds fail most often."""
    rng = np.random.default_rng(47)
    vocabulary = 48 if shape == "peaked" else 1024
    scale = 2.0 if shape == "peaked" else 0.05
    row = (rng.standard_normal(vocabulary) * scale).astype(np.float32)
    draws, chunk = 20_000, 1000
    settings = graph_sampling.row_settings([Row(params, draw) for draw in range(draws)])
    rows = np.tile(row, (chunk, 1))
    tokens = np.concatenate(
        [
            graph_sampler.draw_rows_on_cpu(rows, settings[start : start + chunk], threads=1)
            for start in range(0, draws, chunk)
        ]
    )
    chances = _kept_distribution(row, params)
    counts = np.bincount(tokens, minlength=vocabulary)
    assert counts[chances == 0].sum() == 0
    if shape == "flat":  # too many tokens for a cell each: ten cells of equal chance
        edges = np.searchsorted(np.cumsum(chances), np.linspace(0, 1, 11)[1:-1])
        expected = np.diff([0, *np.cumsum(chances)[edges], 1]) * draws
        observed = np.array([part.sum() for part in np.split(counts, edges + 1)])
    else:
        expected, observed = chances[chances > 0] * draws, counts[chances > 0]
    chi_square = float(((observed - expected) ** 2 / expected).sum())
    cells = len(expected) - 1
    assert chi_square < cells + 7 * np.sqrt(2 * cells), (chi_square, cells)


def test_a_whole_row_draw_depends_on_its_row_seed_and_draw_alone() -> None:
    """The same row, seed and draw index give the same token wherever the row sits in
    the step and whatever rows are beside it."""
    rng = np.random.default_rng(5)
    logits = (rng.standard_normal((64, 1024)) * 2).astype(np.float32)
    rows = [
        Row(replace(WHOLE, seed=int(seed)), draw)
        for draw, seed in enumerate(rng.integers(0, 2**31, 64))
    ]
    settings = graph_sampling.row_settings(rows)
    together = graph_sampler.draw_rows_on_cpu(logits, settings)
    alone = [
        int(graph_sampler.draw_rows_on_cpu(logits[i : i + 1], settings[i : i + 1])[0])
        for i in range(8)
    ]
    assert list(together[:8]) == alone
    order = rng.permutation(64)
    shuffled = graph_sampler.draw_rows_on_cpu(logits[order], settings[order])
    assert list(shuffled) == list(together[order])
    # A new draw index is a new number: the row's tokens are not all one.
    assert len(set(together.tolist())) > 8


def test_whole_rows_drawn_in_the_graph_during_decoding_repeat_with_their_seeds() -> None:
    """Sampled requests without top-k decode through the ROW path, every token drawn
    in the graph, and a seed gives the same tokens again (one request at a time, no
    cached prefix: docs/api.md, "What a seed guarantees")."""
    backend = _backend("on", sequences=1, cached=0)
    try:
        requests: list[Request] = [
            ("Once upon a time", replace(WHOLE, seed=seed), {}) for seed in (11, 12, 13)
        ]
        runs = [[_decode(backend, [request], 12) for request in requests] for _ in range(2)]
    finally:
        backend.close()
    tokens = [run[0][0] for run in runs[0]]
    assert [run[0][0] for run in runs[1]] == tokens
    assert all(all(run[1][0]) for run in runs[0])  # drawn in the graph
    assert len({tuple(row) for row in tokens}) == 3  # three seeds, three texts


def _clustered(rng: np.random.Generator, vocabulary: int) -> npt.NDArray[np.float32]:
    """A row whose best logits crowd into three chunks of 64, the rest spread."""
    row = rng.standard_normal(vocabulary).astype(np.float32)
    for chunk in rng.choice(vocabulary // 64, size=3, replace=False):
        row[chunk * 64 : chunk * 64 + 64] += 8 + rng.random(64).astype(np.float32)
    return row


@pytest.mark.parametrize(
    "vocabulary",
    [
        64 * 2004,  # Llama 3's 128,256: over a thousand chunk maxima, sorted in blocks
        49_152,  # SmolLM2's: 768 chunks, one sort
        50_257,  # GPT-2's, not whole chunks: widened by one chunk's filler
        1_000,  # fewer chunks than candidates: sorted whole
    ],
)
def test_the_graphs_candidates_are_each_rows_best_logits(vocabulary: int) -> None:
    rng = np.random.default_rng(vocabulary)
    top = graph_sampling.GRAPH_TOP
    spread = rng.standard_normal((3, vocabulary)).astype(np.float32) * 4
    logits = np.vstack([spread, _clustered(rng, vocabulary)[None, :]])
    ids, values = graph_sampler.top_on_cpu(logits, top, threads=1)
    expected = np.sort(logits, axis=1)[:, ::-1][:, :top]
    np.testing.assert_array_equal(values, expected)  # largest first
    np.testing.assert_array_equal(np.take_along_axis(logits, ids.astype(np.int64), axis=1), values)
    for row in range(len(logits)):
        assert len(set(ids[row].tolist())) == top
