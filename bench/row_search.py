"""The host's share of a sampled step: searching each row of logits, against an argmax.

On a GPU the forward pass of a step is over in a few milliseconds, and what the
host does with the logits after it decides how much of that speed sampling
keeps. This times, on random logits of a step's shape (rows x vocabulary),
the greedy argmax and the batched sampler's draw (service.backends
.batch_sampling) on the backend's row threads, then on one thread the argmax,
the draw in C and the draw in numpy, so that a change to the draw can be judged
on the machine it is for.

    python -m bench.row_search [--rows 32,64,128] [--vocab 128256] [--threads 8]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

from service.backends.batch_sampling import Row, sample_rows, sample_rows_in_numpy
from service.backends.row_threads import RowThreads
from service.text.requests import SamplingParams

SAMPLED = SamplingParams(
    temperature=0.8, top_p=0.95, top_k=40, min_p=0.05, repeat_penalty=1, seed=7
)


def milliseconds(work: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def one_shape(count: int, vocab: int, threads: RowThreads, repeats: int) -> str:
    """A row of the table: `count` rows of `vocab` logits."""
    logits = (np.random.default_rng(count).standard_normal((count, vocab)) * 3).astype(np.float32)
    rows = [Row(SAMPLED, draw) for draw in range(count)]
    argmax = milliseconds(lambda: threads.argmax(logits), repeats)
    sample = milliseconds(lambda: threads.sample(logits, rows), repeats)
    single = milliseconds(lambda: logits.argmax(axis=1), repeats)
    in_c = milliseconds(lambda: sample_rows(logits, rows), repeats)
    in_numpy = milliseconds(lambda: sample_rows_in_numpy(logits, rows), repeats)
    return (
        f"{count:>5} {argmax:>8.2f} {sample:>8.2f} {sample / argmax:>5.2f} | "
        f"{'':>11} {single:>7.2f} {in_c:>7.2f} {in_numpy:>7.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="32,64,128")
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    threads = RowThreads(args.threads)
    print(f"{'rows':>5} {'argmax':>8} {'sample':>8} {'x':>5} | one thread: "
          f"{'argmax':>7} {'draw C':>7} {'numpy':>7}  (ms)")  # fmt: skip
    for count in args.rows.split(","):
        print(one_shape(int(count), args.vocab, threads, args.repeats), flush=True)
    threads.close()


if __name__ == "__main__":
    main()
