"""Seeded synthetic workloads for bench.serving: what real clients send, reproducibly.

Prompts are distinct texts of a chosen length in the model's own tokens
(random words, measured and cut with the model's tokenizer), and each asks
for an output length drawn from a stated range. Three shapes:

- `random`: independent prompts;
- `shared-prefix`: one long system text that every prompt starts with, then a
  distinct part (what a prefix cache is for);
- `multi-turn`: conversations whose every turn repeats the conversation so far
  (prompt and answer) and adds a new question.

Arrivals are either a fixed concurrency (each client sends its next request
when its last ends) or open-loop at a request rate, with exponential gaps
(a Poisson process), both seeded.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

# Ordinary words, so tokenizers give ordinary counts (about 1.3 tokens a word).
WORDS = (  # noqa: SIM905 - one string reads better than 200 quoted words
    "the of and to in a is that for it as was with be by on not he this are or his from at "
    "which but have an they you were her she there been one all we their can has more when "
    "will would if so no time about into than its only other new some could these two may "
    "first then do any like my now over such our man me even most made after also did many "
    "before must through back years where much your way well down should because each just "
    "those people how too little state good very make world still own see men work long get "
    "here between both life being under never day same another know while last might us great "
    "old year off come since against go came right used take three river city garden machine "
    "letter summer mountain harbour market kitchen window station winter question"
).split()

Tokenize = Callable[[str], list[int]]
Detokenize = Callable[[list[int]], str]


@dataclass(frozen=True)
class Request:
    prompt: str
    prompt_tokens: int
    max_tokens: int
    conversation: int = 0  # multi-turn: which conversation; its turns run in order
    turn: int = 0


@dataclass(frozen=True)
class Lengths:
    """Inclusive ranges, in tokens, that prompt and output lengths are drawn from."""

    prompt: tuple[int, int]
    output: tuple[int, int]
    shared_prefix: int = 0  # shared-prefix: the system text's length


def parse_range(text: str) -> tuple[int, int]:
    """`150` or `100:2000` as an inclusive range."""
    low, _, high = text.partition(":")
    return int(low), int(high or low)


class Texts:
    """Distinct texts of exact token lengths, from a seeded stream of words."""

    def __init__(self, tokenize: Tokenize, detokenize: Detokenize, seed: int) -> None:
        self._tokenize = tokenize
        self._detokenize = detokenize
        self._random = random.Random(seed)

    def count(self, text: str) -> int:
        return len(self._tokenize(text))

    def of(self, tokens: int) -> str:
        words = [self._random.choice(WORDS) for _ in range(tokens + 8)]
        ids = self._tokenize(" ".join(words).capitalize())
        while len(ids) < tokens:  # a rare word-to-token ratio below one
            ids += self._tokenize(" " + self._random.choice(WORDS))
        return self._detokenize(ids[:tokens])


def requests(
    shape: str, count: int, lengths: Lengths, texts: Texts, seed: int, turns: int = 4
) -> list[Request]:
    """`count` requests of the shape, in the order they are sent."""
    draw = random.Random(seed + 1)

    def length(bounds: tuple[int, int]) -> int:
        return draw.randint(*bounds)

    if shape == "random":
        made = [texts.of(length(lengths.prompt)) for _ in range(count)]
        return [_request(text, texts, length(lengths.output)) for text in made]
    if shape == "shared-prefix":
        prefix = texts.of(lengths.shared_prefix)
        made = [prefix + "\n" + texts.of(length(lengths.prompt)) for _ in range(count)]
        return [_request(text, texts, length(lengths.output)) for text in made]
    if shape == "multi-turn":
        return list(_conversations(count, lengths, texts, length, turns))
    raise ValueError(f"unknown dataset {shape!r}: random, shared-prefix or multi-turn")


def _request(text: str, texts: Texts, max_tokens: int, **where: int) -> Request:
    return Request(text, texts.count(text), max_tokens, **where)


def _conversations(
    count: int, lengths: Lengths, texts: Texts, length: Callable[[tuple[int, int]], int], turns: int
) -> Iterator[Request]:
    """Turns whose prompts grow: each repeats the last, a stand-in answer of the length
    the last asked for, and a new question (the servers' own answers differ)."""
    for conversation in range(max(1, count // turns)):
        so_far = ""
        for turn in range(turns):
            question = texts.of(length(lengths.prompt))
            so_far = f"{so_far}\nQ: {question}\nA:" if so_far else f"Q: {question}\nA:"
            max_tokens = length(lengths.output)
            yield _request(so_far, texts, max_tokens, conversation=conversation, turn=turn)
            so_far += " " + texts.of(max_tokens)


def poisson_gaps(count: int, rate: float, seed: int) -> list[float]:
    """Seconds between arrivals at `rate` requests a second, exponentially distributed."""
    draw = random.Random(seed + 2)
    return [draw.expovariate(rate) for _ in range(count)]
