"""The llama.cpp backend driven directly, beside the raw batched loop: whose is a gap?

bench.generate compares the whole service (gRPC, event loop, scheduler) with a
hand-written llama.cpp loop. When the service falls behind at many streams,
this tells the backend's share from the server's: the same prompts, greedy,
through LlamaCppBackend.start/step/finish in this process, no server, no
event loop. Prints tokens/s and milliseconds per step for both, and the step
of the raw loop that never reads its logits (llama-batched-bench's way): the
gap between the last two is what taking each step's tokens costs any server.

    python -m bench.backend_steps --model-path MODEL [--gpu-layers -1] [--streams 8,64]
        [--sample-in-graph on,off] [--samplings greedy,sampled]

With `--sample-in-graph` and `--samplings`, the backend is loaded once per
placement of the draw (issue 39) and each sampling runs on it: milliseconds per
step for each, beside the raw loops.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from bench import raw
from bench.generate import short_prompt
from service.backends.base import ActiveSequence, SequenceRequest
from service.backends.llama_cpp import LlamaCppBackend, LlamaCppOptions
from service.config import available_cores
from service.text.requests import Grammar, SamplingParams

GREEDY = SamplingParams(temperature=0, top_p=1, top_k=0, min_p=0, repeat_penalty=1, seed=0)
# The service's defaults at temperature 0.8, top_p 0.95 (bench.server.SAMPLED).
SAMPLED = SamplingParams(
    temperature=0.8, top_p=0.95, top_k=40, min_p=0.05, repeat_penalty=1, seed=0
)


def start_stream(
    backend: LlamaCppBackend,
    ids: list[int],
    sampling: SamplingParams,
    tokens: int,
    grammar: Grammar | None = None,
) -> ActiveSequence:
    sequence = backend.start(SequenceRequest(tuple(ids), sampling, tokens, grammar=grammar))
    if sequence is None:
        raise SystemExit("the cache has no room for every stream: raise --context-size")
    return sequence


def backend_run(
    backend: LlamaCppBackend,
    prompts: list[list[int]],
    tokens: int,
    sampling: SamplingParams = GREEDY,
) -> tuple[float, int]:
    """Tokens/s and steps for every prompt decoded together, prefill included."""
    start = time.perf_counter()
    running = [start_stream(backend, ids, sampling, tokens) for ids in prompts]
    made = dict.fromkeys(running, 0)
    steps = 0
    while running:
        sampled = backend.step(running, lambda: None)
        steps += 1
        for active, token in zip(list(running), sampled, strict=True):
            if token is None:
                continue
            made[active] += 1
            if made[active] == tokens:
                backend.finish(active)
                running.remove(active)
    return sum(made.values()) / (time.perf_counter() - start), steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-path", type=Path, required=True)
    parser.add_argument("--gpu-layers", type=int, default=0)
    parser.add_argument("--streams", default="1,8,32,64")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--context-size", type=int, default=32768)
    parser.add_argument("--kv-layout", choices=["unified", "per-sequence"], default="unified")
    parser.add_argument("--parallel-sequences", type=int, help="default: the most streams")
    parser.add_argument("--sample-in-graph", default="auto", help="comma-separated: auto, on, off")
    parser.add_argument("--samplings", default="greedy", help="comma-separated: greedy, sampled")
    args = parser.parse_args()
    streams = [int(s) for s in args.streams.split(",")]
    threads = available_cores()
    llama = raw.open_llama(args.model_path, 512, threads, args.gpu_layers)
    unified = args.kv_layout == "unified"
    prompts = {
        count: [
            list(llama.tokenize(short_prompt(1000 * index + i).encode(), add_bos=True))
            for i in range(count)
        ]
        for index, count in enumerate(streams)
    }
    raw.batched_tps(llama, [list(llama.tokenize(b"warm up", add_bos=True))] * 2, 8, threads,
                    unified=unified)  # fmt: skip
    print(f"{'streams':>8} {'raw tok/s':>10} {'raw ms/step':>12} {'unsampled ms/step':>18}")
    for count in streams:
        direct = raw.batched_tps(llama, prompts[count], args.tokens, threads, unified=unified)
        unsampled = raw.batched_tps(
            llama, prompts[count], args.tokens, threads, unified=unified, sample=False
        )
        print(f"{count:>8} {direct:>10.1f} {count / direct * 1000:>12.2f} "
              f"{count / unsampled * 1000:>18.2f}")  # fmt: skip
    llama.close()
    for placement in args.sample_in_graph.split(","):
        backend = LlamaCppBackend(
            args.model_path,
            LlamaCppOptions(
                context_size=args.context_size,
                threads=threads,
                gpu_layers=args.gpu_layers,
                max_sequences=args.parallel_sequences or max(streams),
                kv_layout=args.kv_layout,
                sample_in_graph=placement,
            ),
        )
        # The first pass pays for CUDA's start-up (kernels, graphs): not a step's cost.
        backend_run(backend, [prompts[streams[0]][0]] * 2, 8)
        for kind in args.samplings.split(","):
            sampling = SAMPLED if kind == "sampled" else GREEDY
            for count in streams:
                served, steps = backend_run(backend, prompts[count], args.tokens, sampling)
                step_ms = count * args.tokens / served / steps * 1000
                print(f"backend in-graph {placement:>4} {kind:>8} {count:>4} streams: "
                      f"{served:9.1f} tok/s, {step_ms:7.2f} ms/step")  # fmt: skip
        backend.close()


if __name__ == "__main__":
    main()
