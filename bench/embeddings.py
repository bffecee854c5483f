"""Embeddings per second: the service against llama-server's /v1/embeddings, side by side.

    python -m bench.embeddings [--llama-server PATH/llama-server] [--clients 8]
        [--requests 256] [--per-request 1] [--seed 0]

Distinct sentences of realistic length (20-60 words of the workload's texts, so
12-80 tokens: what a RAG pipeline embeds, chunk by chunk) go to the service's
Embed RPC with the embedded all-MiniLM-L6-v2, and, with `--llama-server`, to
llama.cpp's own server running the same GGUF in its embedding mode with the
same threads, from `--clients` concurrent clients, `--per-request` texts per
request. Prints embeddings/s and the latency of a request (p50/p99) for each,
and the ratio. Both answer with unit-length vectors of the same model, so the
work is the same; a warm-up request is not counted.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from bench.llama_server import llama_server
from bench.server import running_server
from bench.workload import WORDS
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from service.config import available_cores
from service.models.embedded import MINILM_NAME, prepare_minilm

Send = Callable[[list[str]], None]


@dataclass(frozen=True)
class Figures:
    server: str
    embeddings_per_second: float
    latency_ms: dict[str, float]
    errors: int


def sentences(count: int, seed: int) -> list[str]:
    """Distinct texts of 20 to 60 of the workload's words."""
    rng = random.Random(seed)
    return [
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 60))).capitalize() + "."
        for _ in range(count)
    ]


def drive(
    send: Send, texts: list[str], clients: int, per_request: int
) -> tuple[float, list[float], int]:
    """Every text sent `per_request` at a time from `clients` threads: embeddings/s, each
    request's latency, and the failures."""
    batches = [texts[i : i + per_request] for i in range(0, len(texts), per_request)]
    latencies: list[float] = []
    errors = 0
    lock = threading.Lock()
    next_batch = iter(batches)

    def client() -> None:
        nonlocal errors
        while True:
            with lock:
                batch = next(next_batch, None)
            if batch is None:
                return
            started = time.perf_counter()
            try:
                send(batch)
            except Exception:  # counted, and the run goes on: a refusal is a result
                with lock:
                    errors += 1
                continue
            with lock:
                latencies.append((time.perf_counter() - started) * 1000)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return len(texts) / (time.perf_counter() - started), latencies, errors


def service_sender(address: str) -> Send:
    stub = pb_grpc.InferenceStub(grpc.insecure_channel(address))

    def send(batch: list[str]) -> None:
        inputs = [pb.EmbedInput(text=text) for text in batch]
        request = pb.EmbedRequest(model=MINILM_NAME, inputs=inputs)
        reply = stub.Embed(request, timeout=120)
        assert len(reply.embeddings) == len(batch)

    return send


def llama_server_sender(url: str) -> Send:
    def send(batch: list[str]) -> None:
        body = json.dumps({"input": batch, "model": MINILM_NAME}).encode()
        request = urllib.request.Request(
            f"{url}/v1/embeddings", body, {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=120) as answer:
            assert len(json.loads(answer.read())["data"]) == len(batch)

    return send


def measure(name: str, send: Send, texts: list[str], args: argparse.Namespace) -> Figures:
    send(["warm up"])
    rate, latencies, errors = drive(send, texts, args.clients, args.per_request)
    cuts = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else latencies * 99
    return Figures(name, rate, {"p50": cuts[49], "p99": cuts[98]}, errors)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-server", help="a llama-server binary to compare against")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=256, help="texts in all")
    parser.add_argument("--per-request", type=int, default=1)
    parser.add_argument("--threads", type=int, default=available_cores())
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    model = prepare_minilm()
    texts = sentences(args.requests, args.seed)
    results = []
    # The default text model loads too (the server waits for it): the smaller one.
    extra = ["--default-embedding-model", MINILM_NAME]
    with running_server("smollm2-135m-instruct", args.threads, extra) as (address, _):
        results.append(measure("service", service_sender(address), texts, args))
    if args.llama_server:
        flags = ["-t", str(args.threads), "--embeddings", "--pooling", "mean", "-ub", "4096"]
        slots, context = args.clients, 4096 * args.clients
        server = llama_server(args.llama_server, str(model), slots, context, flags)
        with server as url:
            results.append(measure("llama-server", llama_server_sender(url), texts, args))
    print(
        f"{len(texts)} distinct texts of 20-60 words, {args.per_request} a request, "
        f"{args.clients} clients, {args.threads} threads; all-MiniLM-L6-v2 (F16 GGUF)"
    )
    print("server         embeddings/s  latency p50/p99 ms  errors")
    for row in results:
        latency = f"{row.latency_ms['p50']:.1f}/{row.latency_ms['p99']:.1f}"
        print(f"{row.server:14} {row.embeddings_per_second:12.1f}  {latency:>18}  {row.errors:6}")
    if len(results) == 2:
        ratio = results[0].embeddings_per_second / results[1].embeddings_per_second
        print(f"service / llama-server: embeddings/s {ratio:.2f}x")


if __name__ == "__main__":
    main()
