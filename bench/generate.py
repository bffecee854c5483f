"""Generate through the service versus llama-cpp-python itself, same model, same prompts.

    python -m bench.generate [--model gemma3-270m] [--runs 3] [--max-tokens 64]

Both sides evaluate the same prompt from scratch (each run's prompt starts
differently, so neither side can reuse a cached prefix) and decode greedily
for the same number of tokens. The service is timed from the client, through
gRPC, so its figures include everything a user pays for. Runs alternate
between the two sides to spread the machine's noise evenly; medians are
printed with the ratio service / raw.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
from llama_cpp import Llama

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from service.config import available_cores
from service.models.embedded import EMBEDDED_MODELS

PASSAGE = (
    "The history of the printing press begins in the fifteenth century, when movable type made it "
    "possible to reproduce texts quickly and cheaply. Books that once took months to copy by hand "
    "could be printed in days, and ideas spread across Europe faster than ever before. Scholars, "
    "merchants and reformers all used the new technology, and literacy rose as printed material "
    "became common. Within fifty years, presses operated in hundreds of cities. "
)


@dataclass(frozen=True)
class Run:
    ttft_ms: float
    decode_tps: float
    tokens: int


def _prompt(index: int) -> str:
    return f"Document {index}. {PASSAGE * 2}\nSummary:"


def raw_run(llama: Llama, prompt: str, max_tokens: int) -> Run:
    start = time.perf_counter()
    ids = llama.tokenize(prompt.encode(), add_bos=True, special=True)
    llama.reset()
    first = last = start
    count = 0
    for token in llama.generate(ids, temp=0.0, reset=False):
        last = time.perf_counter()
        if count == 0:
            first = last
        count += 1
        if count >= max_tokens or llama_eog(llama, token):
            break
    return Run((first - start) * 1000, (count - 1) / (last - first) if count > 1 else 0.0, count)


def llama_eog(llama: Llama, token: int) -> bool:
    import llama_cpp

    return bool(llama_cpp.llama_vocab_is_eog(llama_cpp.llama_model_get_vocab(llama.model), token))


def service_run(stub: pb_grpc.InferenceStub, model: str, prompt: str, max_tokens: int) -> Run:
    request = pb.GenerateRequest(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0)
    start = time.perf_counter()
    first = last = start
    count = 0
    for event in stub.Generate(request):
        if event.WhichOneof("event") != "delta":
            continue
        last = time.perf_counter()
        if count == 0:
            first = last
        count += len(event.delta.token_ids)
    return Run((first - start) * 1000, (count - 1) / (last - first) if count > 1 else 0.0, count)


def concurrent_tps(stub: pb_grpc.InferenceStub, model: str, streams: int, max_tokens: int) -> float:
    counts: list[int] = []

    def one(index: int) -> None:
        counts.append(service_run(stub, model, _prompt(1000 + index), max_tokens).tokens)

    start = time.perf_counter()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(streams)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(counts) / (time.perf_counter() - start)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@contextmanager
def running_server(
    model: str, threads: int, extra: list[str] | None = None
) -> Iterator[tuple[str, int]]:
    command = [sys.executable, "-m", "service.server", "--listen", "127.0.0.1:0"]
    command += ["--default-model", model, "--threads", str(threads), *(extra or [])]
    env = {**os.environ, "INFERENCE_LOG_FORMAT": "json", "INFERENCE_LOG_LEVEL": "info"}
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
    assert process.stderr is not None
    try:
        address = ""
        for line in process.stderr:
            if not line.startswith("{"):  # llama.cpp writes some lines of its own
                continue
            record = json.loads(line)
            if record.get("event") == "serving":
                address = record["address"]
            if record.get("event") == "default model loaded":
                break
        threading.Thread(target=process.stderr.read, daemon=True).start()
        yield address, process.pid
    finally:
        process.terminate()
        process.wait(timeout=30)
        process.stderr.close()


def median(runs: list[Run], field: str) -> float:
    return float(statistics.median(getattr(run, field) for run in runs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3-270m", choices=sorted(EMBEDDED_MODELS))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--context-size", type=int, default=4096)
    parser.add_argument("--concurrent", type=int, default=4)
    parser.add_argument("--model-path", type=Path, help="any GGUF file instead of --model")
    parser.add_argument("--gpu-layers", type=int, default=0, help="offload to a GPU build")
    args = parser.parse_args()
    threads = available_cores()
    path = args.model_path or EMBEDDED_MODELS[args.model].locate()
    server_flags = ["--gpu-layers", str(args.gpu_layers), "--context-size", str(args.context_size)]
    if args.model_path:
        args.model = "bench"
        server_flags += ["--model", f"bench={path}"]

    before = rss_mib(os.getpid())
    llama = Llama(
        str(path),
        n_ctx=args.context_size,
        n_threads=threads,
        n_threads_batch=threads,
        n_gpu_layers=args.gpu_layers,
        verbose=False,
    )
    raw_rss = rss_mib(os.getpid()) - before
    prompt_tokens = len(llama.tokenize(_prompt(0).encode(), add_bos=True, special=True))

    raw: list[Run] = []
    served: list[Run] = []
    with (
        running_server(args.model, threads, server_flags) as (address, pid),
        grpc.insecure_channel(address) as ch,
    ):
        stub = pb_grpc.InferenceStub(ch)
        service_run(stub, args.model, "warm up", 4)
        raw_run(llama, "warm up", 4)
        for index in range(args.runs):
            raw.append(raw_run(llama, _prompt(index), args.max_tokens))
            served.append(service_run(stub, args.model, _prompt(index), args.max_tokens))
        server_rss = rss_mib(pid)
        llama.close()
        aggregate = concurrent_tps(stub, args.model, args.concurrent, args.max_tokens)

    print(
        f"model {args.model}  prompt {prompt_tokens} tokens  max_tokens {args.max_tokens}  "
        f"threads {threads}  gpu layers {args.gpu_layers}  runs {args.runs} (medians)"
    )
    print(f"{'':28}{'raw llama-cpp':>14}{'service':>12}{'service/raw':>13}")
    for label, field in [
        ("time to first token (ms)", "ttft_ms"),
        ("decode (tokens/s)", "decode_tps"),
    ]:
        r, s = median(raw, field), median(served, field)
        print(f"{label:28}{r:14.1f}{s:12.1f}{s / r:13.2f}")
    print(
        f"{'model memory (RSS MiB)':28}{raw_rss:14.0f}{server_rss:12.0f}"
        f"{server_rss / raw_rss:13.2f}   (service: whole process)"
    )
    single = median(served, "decode_tps")
    print(
        f"{args.concurrent} concurrent streams: {aggregate:.1f} tokens/s aggregate "
        f"({aggregate / single:.2f}x one stream's decode rate)"
    )


if __name__ == "__main__":
    main()
