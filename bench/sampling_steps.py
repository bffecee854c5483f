"""Sampled against greedy decoding in the llama.cpp backend alone: issue 18's ratio, no server.

The same prompts decoded through LlamaCppBackend.start/step/finish, greedy
and sampled (temperature 0.8, top_p 0.95), rounds alternating; prints tokens/s
per stream count and the sampled/greedy ratio. bench.generate gives the same
ratio through the whole service; this one leaves out gRPC and the scheduler.
(At d0f06cb it also measured llama.cpp's top-k on the GPU, which lost.)

    python -m bench.sampling_steps --model-path MODEL --gpu-layers -1 \\
        [--streams 8,32,64,128] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from bench.backend_steps import GREEDY, backend_run
from bench.generate import short_prompt
from service.backends.llama_cpp import LlamaCppBackend, LlamaCppOptions
from service.config import available_cores
from service.text.requests import SamplingParams

SAMPLED = SamplingParams(
    temperature=0.8, top_p=0.95, top_k=40, min_p=0.05, repeat_penalty=1, seed=7
)
MODES = {"greedy": GREEDY, "sampled": SAMPLED}


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
    warm_up = [backend.tokenize("warm up", add_bos=True)] * 2
    for params in MODES.values():  # CUDA's start-up is not a step's cost
        backend_run(backend, warm_up, 8, params)
    print(f"{'streams':>8} {'greedy':>9} {'sampled':>9} {'ratio':>6}  (tokens/s)")
    for index, count in enumerate(streams):
        prompts = [
            backend.tokenize(short_prompt(1000 * index + i), add_bos=True) for i in range(count)
        ]
        measured: dict[str, list[float]] = {mode: [] for mode in MODES}
        for _ in range(args.rounds):
            for mode, params in MODES.items():
                measured[mode].append(backend_run(backend, prompts, args.tokens, params)[0])
        greedy, sampled = (statistics.median(measured[mode]) for mode in MODES)
        print(f"{count:>8} {greedy:>9.0f} {sampled:>9.0f} {sampled / greedy:>6.2f}", flush=True)
    backend.close()


if __name__ == "__main__":
    main()
