"""Sampled against greedy decoding in the llama.cpp backend alone: issue 18's ratio, no server.

The same prompts decoded through LlamaCppBackend.start/step/finish, greedy,
sampled (temperature 0.8, top_p 0.95, top_k 40, min_p 0.05) and sampled without
top-k (top_p alone over the whole vocabulary), rounds alternating; prints tokens/s
per stream count and each one's ratio to greedy. bench.generate gives the same
ratio through the whole service; this one leaves out gRPC and the scheduler.
(At d0f06cb it also measured llama.cpp's top-k on the GPU, which lost.)

A third mode samples the same streams with the first one constrained by a JSON
schema (restarted whenever its document ends): its tokens/s over the sampled
one says whether a grammar costs the batch more than its own row.

    python -m bench.sampling_steps --model-path MODEL --gpu-layers -1 \\
        [--streams 8,32,64,128] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from bench.backend_steps import GREEDY, backend_run, start_stream
from bench.generate import short_prompt
from service.backends.base import ActiveSequence
from service.backends.llama_cpp import LlamaCppBackend, LlamaCppOptions
from service.config import available_cores
from service.grammar.compile import resolve_grammar
from service.text.requests import Grammar, SamplingParams

SAMPLED = SamplingParams(
    temperature=0.8, top_p=0.95, top_k=40, min_p=0.05, repeat_penalty=1, seed=7
)
# Without top-k: top-p decides over the whole vocabulary (sampler.c's whole-row draw,
# where llama.cpp's chain sorted it).
NO_TOP_K = SamplingParams(temperature=0.8, top_p=0.95, top_k=0, min_p=0.0, repeat_penalty=1, seed=7)
MODES = {"greedy": GREEDY, "sampled": SAMPLED, "no top-k": NO_TOP_K}
PERSON = json.dumps(
    {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "age": {"type": "integer"},
            "languages": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["name", "age", "languages"],
    }
)


def with_json_row(
    backend: LlamaCppBackend, prompts: list[list[int]], tokens: int, grammar: Grammar
) -> float:
    """Tokens/s of the prompts sampled together, the first under `grammar` and started
    again whenever its document ends, until every other has made `tokens` tokens."""

    def begin(ids: list[int], constraint: Grammar | None) -> ActiveSequence:
        return start_stream(backend, ids, SAMPLED, tokens, constraint)

    start = time.perf_counter()
    constrained = begin(prompts[0], grammar)
    running = [constrained] + [begin(ids, None) for ids in prompts[1:]]
    made = dict.fromkeys(running, 0)
    total = 0
    while len(running) > 1:
        for active, sampled in zip(list(running), backend.step(running, lambda: None), strict=True):
            if sampled is None:
                continue
            total += sampled.refused is None
            made[active] = made.get(active, 0) + 1
            if active is constrained:
                if sampled.refused or backend.is_end_of_generation(sampled.token):
                    backend.finish(active)
                    constrained = begin(prompts[0], grammar)
                    running[running.index(active)] = constrained
            elif made[active] == tokens:
                backend.finish(active)
                running.remove(active)
    backend.finish(constrained)
    return total / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-path", type=Path, required=True)
    parser.add_argument("--gpu-layers", type=int, default=0)
    parser.add_argument("--streams", default="8,32,64,128")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--context-size", type=int, default=2048)
    parser.add_argument("--kv-layout", choices=["unified", "per-sequence"], default="per-sequence")
    args = parser.parse_args()
    streams = [int(s) for s in args.streams.split(",")]
    backend = LlamaCppBackend(
        args.model_path,
        LlamaCppOptions(
            context_size=args.context_size,
            threads=available_cores(),
            gpu_layers=args.gpu_layers,
            max_sequences=max(streams),
            kv_layout=args.kv_layout,
        ),
    )
    grammar = resolve_grammar(None, PERSON)
    assert grammar is not None
    warm_up = [backend.tokenize("warm up", add_bos=True)] * 2
    for params in MODES.values():  # CUDA's start-up is not a step's cost
        backend_run(backend, warm_up, 8, params)
    print(
        f"{'streams':>8} {'greedy':>9} {'sampled':>9} {'ratio':>6} {'no top-k':>9} {'ratio':>6} "
        f"{'1 JSON row':>11} {'of sampled':>10}  (tokens/s; ratios of greedy)"
    )
    for index, count in enumerate(streams):
        prompts = [
            backend.tokenize(short_prompt(1000 * index + i), add_bos=True) for i in range(count)
        ]
        measured: dict[str, list[float]] = {mode: [] for mode in [*MODES, "json"]}
        for _ in range(args.rounds):
            for mode, params in MODES.items():
                measured[mode].append(backend_run(backend, prompts, args.tokens, params)[0])
            if count > 1:
                measured["json"].append(with_json_row(backend, prompts, args.tokens, grammar))
        greedy, sampled, whole = (statistics.median(measured[mode]) for mode in MODES)
        mixed = statistics.median(measured["json"]) if measured["json"] else float("nan")
        print(
            f"{count:>8} {greedy:>9.0f} {sampled:>9.0f} {sampled / greedy:>6.2f} "
            f"{whole:>9.0f} {whole / greedy:>6.2f} {mixed:>11.0f} {mixed / sampled:>10.2f}",
            flush=True,
        )
    backend.close()


if __name__ == "__main__":
    main()
