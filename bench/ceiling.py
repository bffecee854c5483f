"""llama.cpp's own batched loop at a serving run's lengths: the ceiling row.

`llama-batched-bench` evaluates N prompts of P tokens together, then decodes T
tokens for each of them in lock step: nothing but `llama_decode`, no sampling,
no server. Generated tokens over its total time (prompts included) is the most
a server on the same build, model and batch can give on that workload, and its
prompt time is what the last of N simultaneous requests would wait for its
first token.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass


@dataclass(frozen=True)
class Ceiling:
    streams: int
    output_tokens_per_second: float
    prefill_seconds: float  # every prompt of the batch evaluated
    step_ms: float  # one decode step of the whole batch
    layout: str  # the flag it ran with: -kvu or -no-kvu


def parse_table(text: str, streams: int, layout: str) -> Ceiling:
    """The row for `streams` sequences of llama-batched-bench's markdown table.

    Columns: PP, TG, B, N_KV, T_PP s, S_PP t/s, T_TG s, S_TG t/s, T s, S t/s."""
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 10 or not cells[2].isdigit() or int(cells[2]) != streams:
            continue
        generated, batch = int(cells[1]), int(cells[2])
        prefill, decode, total = float(cells[4]), float(cells[6]), float(cells[8])
        return Ceiling(
            streams=batch,
            output_tokens_per_second=generated * batch / total,
            prefill_seconds=prefill,
            step_ms=decode * 1000 / generated,
            layout=layout,
        )
    raise ValueError(f"llama-batched-bench printed no row for {streams} sequences")


def batched_bench_command(
    binary: str,
    model: str,
    lengths: tuple[int, int],
    streams: int,
    *,
    unified: bool,
    gpu_layers: int,
    threads: int,
) -> list[str]:
    """The service's batch sizes; every layer and flash attention on a GPU, else its threads."""
    prompt, output = lengths
    context = streams * (prompt + output + 16)
    command = [binary, "-m", model, "-c", str(context), "-b", "2048", "-ub", "512"]
    command += ["-npp", str(prompt), "-ntg", str(output), "-npl", str(streams)]
    command += ["-kvu" if unified else "-no-kvu"]
    command += ["-ngl", "99", "-fa", "on"] if gpu_layers else ["-t", str(threads)]
    return command


def measure(command: list[str], streams: int) -> Ceiling:
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.splitlines()[-5:])
        raise SystemExit(f"llama-batched-bench exited with status {done.returncode}:\n{tail}")
    layout = "-kvu" if "-kvu" in command else "-no-kvu"
    return parse_table(done.stdout, streams, layout)
