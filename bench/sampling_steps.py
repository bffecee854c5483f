"""Sampled against greedy decoding in the llama.cpp backend, host search against device top-k.

Issue 18's question, at the level where it is decided: the same prompts
decoded through LlamaCppBackend.start/step/finish (no server), greedy and
sampled (temperature 0.8, top_p 0.95), once with the host searching every
row of logits for its candidates and once with llama.cpp's top-k finding them
on the device (LlamaCppOptions.device_candidates). Prints tokens/s per stream
count and each mode's ratio to host greedy, rounds alternating.

    python -m bench.sampling_steps --model-path MODEL --gpu-layers -1 \\
        [--streams 8,32,64,128] [--device-candidates 128] [--rounds 3]
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
MODES = {
    "host greedy": (False, GREEDY),
    "host sampled": (False, SAMPLED),
    "device greedy": (True, GREEDY),
    "device sampled": (True, SAMPLED),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-path", type=Path, required=True)
    parser.add_argument("--gpu-layers", type=int, default=0)
    parser.add_argument("--streams", default="8,32,64,128")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--context-size", type=int, default=2048)
    parser.add_argument("--kv-layout", choices=["unified", "per-sequence"], default="per-sequence")
    parser.add_argument("--device-candidates", type=int, default=128)
    args = parser.parse_args()
    streams = [int(s) for s in args.streams.split(",")]
    backends = {
        on_device: LlamaCppBackend(
            args.model_path,
            LlamaCppOptions(
                context_size=args.context_size,
                threads=available_cores(),
                gpu_layers=args.gpu_layers,
                max_sequences=max(streams),
                kv_layout=args.kv_layout,
                device_candidates=args.device_candidates if on_device else 0,
            ),
        )
        for on_device in (False, True)
    }
    host = backends[False]
    for backend in backends.values():  # CUDA's start-up is not a step's cost
        warm_up = [host.tokenize("warm up", add_bos=True)] * 2
        backend_run(backend, warm_up, 8, GREEDY)
        backend_run(backend, warm_up, 8, SAMPLED)
    print(
        f"{'streams':>8} "
        + " ".join(f"{mode:>15}" for mode in MODES)
        + "   (tokens/s; x host greedy)"
    )
    for index, count in enumerate(streams):
        prompts = [
            host.tokenize(short_prompt(1000 * index + i), add_bos=True) for i in range(count)
        ]
        measured: dict[str, list[float]] = {mode: [] for mode in MODES}
        for _ in range(args.rounds):
            for mode, (on_device, params) in MODES.items():
                tps, _ = backend_run(backends[on_device], prompts, args.tokens, params)
                measured[mode].append(tps)
        medians = {mode: statistics.median(values) for mode, values in measured.items()}
        base = medians["host greedy"]
        cells = [f"{tps:>7.0f} {tps / base:>5.2f}x" for tps in medians.values()]
        print(f"{count:>8} " + " ".join(f"{cell:>15}" for cell in cells), flush=True)
    for backend in backends.values():
        backend.close()


if __name__ == "__main__":
    main()
