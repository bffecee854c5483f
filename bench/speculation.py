"""Prompt-lookup speculation (issue 47): one stream's tokens/s with and without.

    python -m bench.speculation [--model gemma3-270m | --model-path MODEL]
        [--draft-tokens 4,8] [--tokens 96] [--rounds 2] [--gpu-layers -1]

Drives the llama.cpp backend in this process (no server: one stream's gain is
the backend's), greedy, one stream at a time, on two workloads: answers that
repeat their input (a function edited, a passage copied, a list continued),
where lookup finds guesses, and answers that do not (story openings). Each
prompt runs once per setting, settings alternating within a round so that a
machine whose speed drifts shows as spread; prints tokens/s after the first
token per setting and workload, with the ratio to no speculation.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from service.backends.base import SequenceRequest
from service.backends.llama_cpp import LlamaCppBackend, LlamaCppOptions
from service.config import available_cores
from service.models.embedded import EMBEDDED_MODELS
from service.text.requests import SamplingParams

GREEDY = SamplingParams(temperature=0, top_p=1, top_k=0, min_p=0, repeat_penalty=1, seed=0)

FUNCTION = '''def load_settings(path):
    """Read the settings file and return a dict of its values."""
    values = {}
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if "=" not in line:
                raise ValueError(f"line {number}: expected key = value")
            key, value = line.split("=", 1)
            values[key.strip()] = value.strip()
    return values
'''

PASSAGE = (
    "The committee met on Tuesday to review the budget for the coming year. It agreed to "
    "raise spending on road repairs by four percent, to keep the library open on Sundays, "
    "and to delay the new swimming pool until a second survey of the site is finished. "
    "Two members voted against the library hours, saying the cost of staff had not been "
    "counted."
)

REPEATING = (
    f"{FUNCTION}\n# The same function, with the encoding passed in as an argument:\n\n"
    f"def load_settings(path, encoding):\n",
    f"Passage: {PASSAGE}\n\nCopy the passage word for word.\nCopy: The committee met",
    "Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday. January, February, "
    "March, April, May, June, July, August, September, October, November, December.\n"
    "Again, the days and the months: Monday, Tuesday,",
    f"Meeting notes.\n{PASSAGE}\n\nSummary, quoting the decisions: the committee agreed to",
)

FRESH = (
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "The first thing you notice when you land in the city is",
    "Write a short poem about the winter light over the mountains:\n",
    "A recipe for a simple vegetable soup. First,",
)


def one_stream(backend: LlamaCppBackend, text: str, tokens: int) -> float:
    """Tokens/s after the first token, for one greedy answer of `tokens` tokens."""
    prompt = tuple(backend.tokenize(text, add_bos=backend.adds_bos))
    sequence = backend.start(SequenceRequest(prompt, GREEDY, tokens))
    assert sequence is not None
    made, first = 0, 0.0
    while made < tokens:
        sampled = backend.step([sequence], lambda: None)[0]
        if sampled is None:
            continue
        if not made:
            first = time.perf_counter()
        made += len(sampled.run)
    seconds = time.perf_counter() - first
    backend.finish(sequence)
    return (made - 1) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--model-path", type=Path)
    parser.add_argument("--draft-tokens", default="4,8")
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--gpu-layers", type=int, default=0)
    parser.add_argument("--threads", type=int, default=available_cores())
    args = parser.parse_args()
    path = args.model_path or EMBEDDED_MODELS[args.model].locate()
    settings = [0, *(int(n) for n in args.draft_tokens.split(","))]
    backends = {
        drafts: LlamaCppBackend(
            path,
            LlamaCppOptions(
                context_size=2048,
                threads=args.threads,
                gpu_layers=args.gpu_layers,
                max_sequences=1,
                cached_sequences=0,  # every answer reads its prompt afresh
                draft_tokens=drafts,
            ),
        )
        for drafts in settings
    }
    rates: dict[tuple[str, int], list[float]] = {}
    for round_index in range(args.rounds):
        for workload, prompts in (("repeating", REPEATING), ("fresh", FRESH)):
            for text in prompts:
                for drafts in settings:
                    rate = one_stream(backends[drafts], text, args.tokens)
                    rates.setdefault((workload, drafts), []).append(rate)
            row = "  ".join(
                f"drafts {drafts}: {statistics.mean(rates[workload, drafts][-len(prompts) :]):.1f}"
                for drafts in settings
            )
            print(f"round {round_index + 1}, {workload}: {row} tokens/s", flush=True)
    for workload in ("repeating", "fresh"):
        base = statistics.mean(rates[workload, 0])
        ratios = "  ".join(
            f"drafts {drafts}: {statistics.mean(rates[workload, drafts]) / base:.2f}x"
            for drafts in settings[1:]
        )
        print(f"{workload}: no speculation {base:.1f} tokens/s; {ratios}")
    for backend in backends.values():
        backend.close()


if __name__ == "__main__":
    main()
