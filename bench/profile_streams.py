"""Many concurrent streams against the service, optionally under py-spy: where a step's time goes.

    python -m bench.profile_streams --model-path FILE.gguf --gpu-layers -1 --streams 64 \\
        [--kv-layout per-sequence --context-size 2048] [--stream-interval 4] \\
        [--client-processes 4] \\
        [--py-spy py-spy --native] [--out DIR]

Prints aggregate tokens/s and each stream's median decode rate and TTFT. With
--client-processes the clients are spread over that many processes, to tell a
slow client from a slow server. With --py-spy, a second load runs for
--seconds while py-spy samples the server's threads into DIR/py-spy.txt
(collapsed stacks, one line per stack with its count).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import subprocess
import threading
import time
from pathlib import Path

import grpc

from bench.generate import short_prompt
from bench.py_spy import record_command
from bench.server import Run, running_server, service_run
from inference.v1 import inference_pb2_grpc as pb_grpc
from service.config import available_cores

MODEL = "bench"


def stream_all(address: str, streams: int, first: int, max_tokens: int) -> list[Run]:
    """`streams` greedy generations released together on one channel; their runs."""
    runs: list[Run] = []
    barrier = threading.Barrier(streams)
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.InferenceStub(channel)

        def one(index: int) -> None:
            barrier.wait()
            runs.append(service_run(stub, MODEL, short_prompt(first + index), max_tokens))

        threads = [threading.Thread(target=one, args=(i,)) for i in range(streams)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return runs


def _client_process(address: str, streams: int, first: int, tokens: int, queue: object) -> None:
    queue.put(stream_all(address, streams, first, tokens))  # type: ignore[attr-defined]


def measure(address: str, streams: int, tokens: int, processes: int) -> dict[str, float]:
    start = time.perf_counter()
    if processes == 1:
        runs = stream_all(address, streams, 0, tokens)
    else:
        queue: multiprocessing.Queue[list[Run]] = multiprocessing.Queue()
        share = streams // processes
        workers = [
            multiprocessing.Process(
                target=_client_process, args=(address, share, 1000 * k, tokens, queue)
            )
            for k in range(processes)
        ]
        for worker in workers:
            worker.start()
        runs = [run for _ in workers for run in queue.get()]
        for worker in workers:
            worker.join()
    elapsed = time.perf_counter() - start
    return {
        "streams": len(runs),
        "client_processes": processes,
        "tokens_per_s": round(sum(run.tokens for run in runs) / elapsed, 1),
        "median_stream_tokens_per_s": round(statistics.median(r.decode_tps for r in runs), 1),
        "median_ttft_ms": round(statistics.median(r.ttft_ms for r in runs), 1),
    }


def profile(args: argparse.Namespace, address: str, pid: int) -> None:
    stop = time.monotonic() + args.seconds + 4
    load = threading.Thread(target=_load_until, args=(address, args, stop), daemon=True)
    load.start()
    time.sleep(2)
    out = args.out / "py-spy.txt"
    command = record_command(args.py_spy, pid, out, seconds=args.seconds, native=args.native)
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    print(f"py-spy exit {done.returncode}: {out}", done.stderr[-300:])
    load.join()


def _load_until(address: str, args: argparse.Namespace, stop: float) -> None:
    while time.monotonic() < stop:
        stream_all(address, args.streams, 5000, args.max_tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model-path", type=Path, required=True)
    parser.add_argument("--gpu-layers", type=int, default=0)
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--kv-layout", choices=("unified", "per-sequence"), default="unified")
    parser.add_argument("--context-size", type=int, default=32768)
    parser.add_argument("--stream-interval", type=int, default=1, help="the server's")
    parser.add_argument("--client-processes", type=int, default=1)
    parser.add_argument("--py-spy", help="py-spy executable: also profile the server")
    parser.add_argument("--native", action="store_true", help="py-spy --native (C frames)")
    parser.add_argument("--seconds", type=int, default=4)
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    flags = ["--model", f"{MODEL}={args.model_path}", "--gpu-layers", str(args.gpu_layers)]
    flags += ["--kv-layout", args.kv_layout, "--context-size", str(args.context_size)]
    flags += ["--stream-interval", str(args.stream_interval)]
    flags += ["--parallel-sequences", str(args.streams), "--max-concurrent", str(args.streams)]
    with running_server(MODEL, available_cores(), flags) as (address, pid):
        stream_all(address, 1, 0, 4)  # warm up
        for processes in sorted({1, args.client_processes}):
            print(json.dumps(measure(address, args.streams, args.max_tokens, processes)))
        if args.py_spy:
            profile(args, address, pid)


if __name__ == "__main__":
    main()
