"""llama.cpp's own server as a peer: the same model and prompts, N streams at once.

    python -m bench.llama_server --binary PATH/llama-server --model-path FILE.gguf \\
        [--streams 1,8,32,64,128] [--stream-tokens 128] [--runs 3]

Starts `llama-server` with a slot per stream (`-np`), one KV cache shared by all
(`-kvu`), flash attention and every layer on the GPU, then sends the streams at
once over its HTTP API (`/completion`, streamed), greedy and sampled
(temperature 0.8, top_p 0.95) in alternating rounds, with the prompts
`bench.generate` uses. It prints aggregate tokens/s per stream count (medians),
the row to set beside the service's in `bench.generate`'s table. A second
llama.cpp-based server under the same load says whether a gap is ours or
llama.cpp's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

from bench.generate import short_prompt
from bench.server import SAMPLED, concurrent_tps
from service.cluster.launcher import free_port

GREEDY = {"temperature": 0.0}


# Every layer on the GPU, flash attention, the batch sizes the service uses.
GPU_FLAGS = ["-ngl", "99", "-fa", "on", "-b", "2048", "-ub", "512"]


@contextmanager
def llama_server(
    binary: str,
    model: str,
    slots: int,
    context: int,
    flags: list[str] = GPU_FLAGS,
    *,
    unified: bool = True,
) -> Iterator[str]:
    """A running llama-server with a slot per stream, plus `flags`; its base URL.

    `context` is the cells of all slots together: one KV cache shared by all of
    them (-kvu) when `unified`, else an equal share for each slot."""
    port = free_port("127.0.0.1")
    command = [binary, "-m", model, "-np", str(slots), "-c", str(context), *flags]
    command += ["-kvu"] if unified else []
    command += ["--host", "127.0.0.1", "--port", str(port)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, process)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def wait_healthy(url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"llama-server exited with status {process.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise SystemExit("llama-server never became healthy")


def completion_tokens(url: str, prompt: str, tokens: int, sampling: dict[str, float]) -> int:
    """One streamed completion; the tokens it generated."""
    body = {"prompt": prompt, "n_predict": tokens, "stream": True, "cache_prompt": True}
    request = urllib.request.Request(
        f"{url}/completion",
        data=json.dumps({**body, **sampling}).encode(),
        headers={"Content-Type": "application/json"},
    )
    generated = 0
    with urllib.request.urlopen(request, timeout=600) as answer:
        for line in answer:
            if not line.startswith(b"data: "):
                continue
            event = json.loads(line[6:])
            if event.get("stop"):
                timings = event.get("timings") or {}
                generated = int(
                    event.get("tokens_predicted") or timings.get("predicted_n") or generated
                )
            elif event.get("content") is not None:
                generated += 1
    return generated


def aggregate_tps(
    url: str, streams: int, tokens: int, first: int, sampling: dict[str, float]
) -> float:
    def one(index: int) -> int:
        return completion_tokens(url, short_prompt(first + index), tokens, sampling)

    return concurrent_tps(streams, one)


def measure(args: argparse.Namespace) -> list[tuple[int, float, float]]:
    rows = []
    most = max(args.streams)
    with llama_server(args.binary, args.model_path, most, most * (64 + args.stream_tokens)) as url:
        aggregate_tps(url, 1, 8, 0, GREEDY)  # warm up
        for round_index, streams in enumerate(args.streams):
            greedy, sampled = [], []
            for run in range(args.runs):
                first = 1000 * (round_index + 1) + 20 * run
                greedy.append(aggregate_tps(url, streams, args.stream_tokens, first, GREEDY))
                sampled.append(aggregate_tps(url, streams, args.stream_tokens, first + 10, SAMPLED))
            rows.append((streams, statistics.median(greedy), statistics.median(sampled)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.llama_server", description=__doc__)
    parser.add_argument("--binary", required=True, help="the llama-server executable")
    parser.add_argument("--model-path", required=True)
    parser.add_argument(
        "--streams", type=lambda text: [int(n) for n in text.split(",")], default=[1, 8, 32, 64]
    )
    parser.add_argument("--stream-tokens", type=int, default=128)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print(f"llama-server, {args.model_path}, {args.stream_tokens} tokens a stream, ", end="")
    print(f"medians of {args.runs}")
    print(f"{'streams':>10}{'greedy tok/s':>15}{'sampled tok/s':>15}{'sampled/greedy':>16}")
    for streams, greedy, sampled in measure(args):
        print(f"{streams:10d}{greedy:15.1f}{sampled:15.1f}{sampled / greedy:16.2f}")


if __name__ == "__main__":
    main()
