"""Starting the service in a subprocess and timing Generate calls against it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from service.engine.measure import rss_bytes


@dataclass(frozen=True)
class Run:
    """One timed generation: what a client saw."""

    ttft_ms: float
    decode_tps: float
    tokens: int
    cached_prompt_tokens: int = 0


def rate(tokens: int, first: float, last: float) -> float:
    """Tokens per second after the first one (the first one is TTFT's)."""
    return (tokens - 1) / (last - first) if tokens > 1 and last > first else 0.0


def concurrent_tps(streams: int, one: Callable[[int], int]) -> float:
    """Aggregate tokens/s of `streams` calls of `one(index)` (each returns the tokens it
    generated), started together on threads of their own."""
    counts: list[int] = []
    barrier = threading.Barrier(streams + 1)

    def run(index: int) -> None:
        barrier.wait()
        counts.append(one(index))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(streams)]
    for thread in threads:
        thread.start()
    barrier.wait()
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    return sum(counts) / (time.perf_counter() - start)


# What people sample with: the setting of the "sampled" rows beside the greedy ones.
SAMPLED = {"temperature": 0.8, "top_p": 0.95}
# Sampled without top-k: top-p and min-p decide over the whole vocabulary.
WHOLE_ROW = {"temperature": 0.8, "top_p": 0.95, "top_k": 0}


def service_run(
    stub: pb_grpc.InferenceStub,
    model: str,
    prompt: str,
    max_tokens: int,
    sampling: dict[str, float] | None = None,
) -> Run:
    """One request, greedy unless `sampling` (GenerateRequest fields) says otherwise."""
    request = pb.GenerateRequest(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0)
    for field, value in (sampling or {}).items():
        setattr(request, field, value)
    start = time.perf_counter()
    first = last = start
    count = cached = 0
    server_ttft_ms = 0.0
    for event in stub.Generate(request):
        kind = event.WhichOneof("event")
        if kind == "finished":
            cached = event.finished.usage.cached_prompt_tokens
            server_ttft_ms = event.finished.timing.ttft_ms
        if kind != "delta":
            continue
        last = time.perf_counter()
        if count == 0:
            first = last
        count += len(event.delta.token_ids)
    # A generation that ends at its first token sends no text: take the server's TTFT.
    ttft_ms = (first - start) * 1000 if count else server_ttft_ms
    return Run(ttft_ms, rate(count, first, last), count, cached)


def rss_mib(pid: int, *, with_children: bool = False) -> float:
    """Resident memory of `pid`, and with `with_children` of its child processes too."""
    total = rss_bytes(pid) / (1 << 20)
    if with_children:
        total += sum(rss_mib(child, with_children=True) for child in children(pid))
    return total


def children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text()
        found += [int(child) for child in text.split()]
    return found


@contextmanager
def running_server(
    model: str, threads: int, extra: list[str] | None = None
) -> Iterator[tuple[str, int]]:
    """The service in a subprocess, serving `model` by default; its address and pid."""
    command = [sys.executable, "-m", "service.front", "--listen", "127.0.0.1:0"]
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
