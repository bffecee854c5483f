"""What the OpenAI-compatible HTTP port costs beside gRPC, in one run.

    python -m bench.http [--model gemma3-270m] [--pairs 6] [--max-tokens 64]

One server (default settings, `--http-listen` on), one stream at a time. Each
pair sends a distinct 16-word prompt over gRPC (Generate, a prompt) and another
over HTTP (POST /v1/completions, streamed), greedy, in alternating order: a
prompt of its own for each, so neither finds the other's in the prompt cache,
and neither side always goes first. It prints the median time to first token
and decode tokens/s of each side, the median of the pairs' TTFT differences
(target: at most +2 ms for HTTP) and the tokens/s ratio (at least 0.97).
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import statistics
import time

import grpc
import httpx2 as httpx

from bench.server import Run, rate, running_server, service_run
from bench.workload import WORDS
from inference.v1 import inference_pb2_grpc as pb_grpc
from service.config import available_cores

TTFT_BUDGET_MS = 2.0
TPS_FLOOR = 0.97


def http_run(client: httpx.Client, url: str, model: str, prompt: str, max_tokens: int) -> Run:
    """One streamed completion over HTTP, timed as the gRPC one is (on a client made
    beforehand, as the gRPC channel is: making one reads the CA bundle, ~20 ms)."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    first = last = start
    tokens = 0
    with client.stream("POST", url, json=body) as reply:
        for line in reply.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            elif chunk["choices"] and chunk["choices"][0]["text"]:
                last = time.perf_counter()
                if first == start:
                    first = last
    return Run((first - start) * 1000, rate(tokens, first, last), tokens)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def prompts(count: int, words: int, seed: int) -> list[str]:
    """Distinct prompts of `words` words each."""
    draw = random.Random(seed)
    return [" ".join(draw.choice(WORDS) for _ in range(words)).capitalize() for _ in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=64)
    # Short, so that the prompt's evaluation (and its noise) does not hide the transport.
    parser.add_argument("--prompt-words", type=int, default=16)
    parser.add_argument("--threads", type=int, default=available_cores())
    args = parser.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1/completions"
    grpc_runs: list[Run] = []
    http_runs: list[Run] = []
    serving = running_server(args.model, args.threads, ["--http-listen", f"127.0.0.1:{port}"])
    with (
        serving as (address, _),
        grpc.insecure_channel(address) as channel,
        httpx.Client(timeout=300) as client,
    ):
        stub = pb_grpc.InferenceStub(channel)

        def over_grpc(prompt: str) -> None:
            grpc_runs.append(service_run(stub, args.model, prompt, args.max_tokens))

        def over_http(prompt: str) -> None:
            http_runs.append(http_run(client, url, args.model, prompt, args.max_tokens))

        service_run(stub, args.model, "warm up", 2)  # first-call costs paid on both paths
        http_run(client, url, args.model, "warm up", 2)
        # A prompt of its own per run: neither side finds the other's cached.
        texts = iter(prompts(2 * args.pairs, args.prompt_words, seed=0))
        for index in range(args.pairs):
            sides = [over_grpc, over_http] if index % 2 == 0 else [over_http, over_grpc]
            for side in sides:
                side(next(texts))
    report(grpc_runs, http_runs)


def report(grpc_runs: list[Run], http_runs: list[Run]) -> None:
    def median(runs: list[Run], field: str) -> float:
        return float(statistics.median(getattr(run, field) for run in runs))

    grpc_ttft, http_ttft = median(grpc_runs, "ttft_ms"), median(http_runs, "ttft_ms")
    # Each pair's own difference: the two runs of a pair saw the same machine load.
    paired = [h.ttft_ms - g.ttft_ms for g, h in zip(grpc_runs, http_runs, strict=True)]
    grpc_tps, http_tps = median(grpc_runs, "decode_tps"), median(http_runs, "decode_tps")
    print(f"{len(grpc_runs)} pairs, one stream, greedy; medians")
    print("surface   TTFT ms   decode tokens/s")
    print(f"gRPC     {grpc_ttft:8.1f}   {grpc_tps:15.1f}")
    print(f"HTTP     {http_ttft:8.1f}   {http_tps:15.1f}")
    difference = statistics.median(paired)
    ratio = http_tps / grpc_tps if grpc_tps else 0.0
    print(
        f"HTTP - gRPC TTFT, median of the pairs' differences, {difference:+.1f} ms "
        f"(target <= +{TTFT_BUDGET_MS:g}: "
        f"{'met' if difference <= TTFT_BUDGET_MS else 'MISSED'}); tokens/s {ratio:.3f}x "
        f"(target >= {TPS_FLOOR}: {'met' if ratio >= TPS_FLOOR else 'MISSED'})"
    )


if __name__ == "__main__":
    main()
