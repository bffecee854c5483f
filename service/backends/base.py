"""What the decode loop needs from a text backend.

A backend wraps one loaded model of one library. Its methods are small and
synchronous; they run on the worker thread that owns the model, never on the
event loop. Sampling happens inside the backend (each library samples on its
own logits), with parameters the shared loop resolved and validated.

Backends produce tokens in one of two ways:
- `BatchingBackend` advances many sequences together, one step at a time
  (llama.cpp decodes them in one batch);
- `StreamingBackend` produces the tokens of one request as a generator
  (mlx-lm's generate_step); the scheduler runs such a backend one request
  at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from service.errors import ServiceError
from service.text.plain_content import ControlTexts
from service.text.requests import Grammar, SamplingDefaults, SamplingParams, TokenLogprob


@dataclass
class TokenStream:
    """Sampled tokens for one request, one at a time, lazily.

    `cached_prompt_tokens` counts the prompt tokens reused from the model's
    cache instead of evaluated again.
    """

    cached_prompt_tokens: int
    tokens: Generator[int, None, None]


@dataclass(frozen=True)
class SequenceRequest:
    """What a batching backend needs to start one sequence."""

    prompt_ids: tuple[int, ...]
    sampling: SamplingParams
    # Tokens the sequence may still generate; the backend reserves room for them.
    max_tokens: int
    # The grammar every sampled token must fit; None for free text.
    grammar: Grammar | None = None
    # Report each token's logprob with this many alternatives; None: no logprobs.
    top_logprobs: int | None = None


@dataclass(frozen=True)
class Sampled:
    """A token a sequence sampled, with its logprobs when the request asked; or,
    with `refused`, why this sequence cannot go on (its grammar allows no token):
    it alone ends with that error, the rest of the batch is unaffected."""

    token: int
    logprob: TokenLogprob | None = None
    refused: ServiceError | None = None
    # Drawn inside the model library's graph (llama.cpp's, on the GPU), not on the host.
    in_graph: bool = False
    # The tokens after this one that the same step verified (speculative decoding:
    # drafted tokens the model agreed with, then its own next one), in order.
    more: tuple[Sampled, ...] = ()

    @property
    def run(self) -> tuple[Sampled, ...]:
        """Every token this step gave the sequence, this one first."""
        return (self, *self.more)


class ActiveSequence(Protocol):
    @property
    def cached_prompt_tokens(self) -> int:
        """Prompt tokens reused from the cache instead of evaluated again."""
        ...


def common_prefix_length(cached: Sequence[int], prompt: Sequence[int]) -> int:
    """How many leading tokens two sequences share: what a prompt cache can reuse."""
    common = 0
    for old, new in zip(cached, prompt, strict=False):
        if old != new:
            break
        common += 1
    return common


class TextBackend(Protocol):
    @property
    def name(self) -> str:
        """The library, as clients see it: "llama.cpp", "mlx-lm"."""
        ...

    @property
    def context_length(self) -> int: ...

    @property
    def adds_bos(self) -> bool:
        """Whether the model expects a beginning-of-sequence token before a prompt."""
        ...

    def is_end_of_generation(self, token_id: int) -> bool:
        """Whether the token ends a turn (eos, eot, <|im_end|>, ...)."""
        ...

    @property
    def chat_template(self) -> str | None:
        """The model's own Jinja chat template, if it ships one."""
        ...

    @property
    def template_tokens(self) -> dict[str, str]:
        """Special token strings a chat template refers to (bos_token, eos_token)."""
        ...

    def sampling_defaults(self) -> SamplingDefaults: ...

    def tokenize(self, text: str, *, add_bos: bool, special: bool = True) -> list[int]:
        """Token ids of `text`; `special`: special tokens written in it (a rendered chat
        template's markers) become their ids, else they are plain text."""
        ...

    def control_texts(self) -> ControlTexts:
        """The texts that tokenizing with `special` turns into special tokens."""
        ...

    def token_bytes(self, token_id: int) -> bytes: ...

    @property
    def vocab_size(self) -> int:
        """How many token ids the model has: a request's ids are below it."""
        ...

    def detokenize(self, token_ids: Sequence[int]) -> str:
        """The text ids of the vocabulary write, special tokens as their text (invalid
        UTF-8 as U+FFFD)."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class StreamingBackend(TextBackend, Protocol):
    def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> TokenStream:
        """Start generating after `prompt_ids`; nothing runs until iterated."""
        ...


class SequenceStepper(Protocol):
    """Advances running sequences together, one scheduler step at a time."""

    @property
    def max_sequences(self) -> int:
        """How many sequences one step may advance together."""
        ...

    @property
    def computes_off_cpu(self) -> bool:
        """Whether the forward pass runs on another device, leaving the CPU free."""
        ...

    def start(self, request: SequenceRequest) -> ActiveSequence | None:
        """Claim cache room for a new sequence, or None when there is none now.

        Raises a ServiceError when this request cannot run at all (a grammar
        the model's vocabulary cannot satisfy, a feature the backend lacks).
        """
        ...

    def step(
        self, sequences: Sequence[ActiveSequence], before_compute: Callable[[], None]
    ) -> list[Sampled | None]:
        """Advance every sequence by one scheduler step.

        `before_compute` runs once the step's input is ready. Where the model
        `computes_off_cpu`, it runs on another thread during the forward pass
        (the scheduler hands out the previous step's tokens then, so that work
        costs the step nothing); it must not call `start`, `step` or `finish`.
        Elsewhere it runs just before the forward pass, on the caller's thread.
        Returns, per sequence, what it sampled, or None while its prompt
        is still being evaluated (long prompts take several steps). A step that
        verified drafted tokens gives a sequence several (`Sampled.run`).
        """
        ...

    def finish(self, sequence: ActiveSequence) -> None:
        """Release the sequence; what it evaluated may stay cached for the next one."""
        ...

    def interrupt_step(self, interrupted: bool) -> None:
        """Ask the step in progress to stop as soon as it can (True), or stop asking
        (False); called from any thread. A step that stops early returns None for every
        sequence it did not sample, and the sequences it held can only be finished: the
        scheduler asks only when every request in the step was cancelled. A backend that
        cannot stop mid-step (a GPU's forward pass, a stream) ignores it."""
        ...


@runtime_checkable
class BatchingBackend(TextBackend, SequenceStepper, Protocol):
    """A backend that decodes several sequences in one batch (llama.cpp)."""
