"""The decode loop shared by every text backend.

`plan_decode` checks that a prompt fits the context window and fixes the
length budget; `decode` drives a backend's token stream and owns everything
that must behave the same whatever library runs the model: end-of-generation
tokens, stop sequences, max_tokens, the wall-clock ceiling, cancellation,
time-to-first-token and usage counts.

It runs on the model's worker thread and yields `Delta` events, then one
`Finished` event (none when cancelled: nobody is listening any more).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from service.backends.base import TextBackend
from service.decode.text import Released, TextAssembler
from service.errors import InvalidRequest
from service.generation import (
    Delta,
    Finished,
    FinishReason,
    SamplingParams,
    Timing,
    Usage,
)


@dataclass(frozen=True)
class DecodePlan:
    prompt_ids: tuple[int, ...]
    max_tokens: int
    stop: tuple[str, ...]
    sampling: SamplingParams
    # Wall-clock ceiling on decoding, in seconds; None for no ceiling.
    time_limit_s: float | None


def fit_max_tokens(
    prompt_tokens: int, requested: int | None, default: int, context_length: int
) -> int:
    """The completion budget, or InvalidRequest when the prompt does not fit."""
    room = context_length - prompt_tokens
    if room < 1:
        raise InvalidRequest(
            f"the prompt is {prompt_tokens} tokens; the context window of "
            f"{context_length} tokens leaves no room to generate. Shorten the prompt."
        )
    if requested is None:
        return min(default, room)
    if requested > room:
        raise InvalidRequest(
            f"prompt ({prompt_tokens} tokens) + max_tokens ({requested}) exceeds the "
            f"context window of {context_length} tokens; ask for at most {room} tokens "
            "or shorten the prompt."
        )
    return requested


@dataclass
class _Progress:
    """Clock readings of one request (time.monotonic seconds)."""

    received_at: float
    started_at: float
    completion_tokens: int = 0
    first_token_at: float | None = None

    def timing(self, now: float) -> Timing:
        first = self.first_token_at if self.first_token_at is not None else now
        decode_seconds = now - first
        later_tokens = max(self.completion_tokens - 1, 0)
        rate = later_tokens / decode_seconds if decode_seconds > 0 else 0.0
        return Timing(
            ttft_ms=(first - self.received_at) * 1000,
            decode_tokens_per_second=rate,
            total_ms=(now - self.received_at) * 1000,
            queue_ms=(self.started_at - self.received_at) * 1000,
        )


def _delta(released: Released) -> Iterator[Delta]:
    if released.text:
        yield Delta(released.text, released.token_ids)


def decode(
    backend: TextBackend,
    plan: DecodePlan,
    cancelled: threading.Event,
    received_at: float,
) -> Iterator[Delta | Finished]:
    """Run one generation; `received_at` is when the request reached the server."""
    progress = _Progress(received_at=received_at, started_at=time.monotonic())
    deadline = None if plan.time_limit_s is None else progress.started_at + plan.time_limit_s
    assembler = TextAssembler(plan.stop)
    stream = backend.generate(plan.prompt_ids, plan.sampling)
    reason, stop_sequence = FinishReason.LENGTH, ""
    try:
        for token in stream.tokens:
            now = time.monotonic()
            if progress.first_token_at is None:
                progress.first_token_at = now
            if cancelled.is_set():
                return
            if backend.is_end_of_generation(token):
                reason = FinishReason.END_OF_TURN
                break
            progress.completion_tokens += 1
            released = assembler.push(token, backend.token_bytes(token))
            yield from _delta(released)
            if released.stop_sequence is not None:
                reason, stop_sequence = FinishReason.STOP_SEQUENCE, released.stop_sequence
                break
            if progress.completion_tokens >= plan.max_tokens:
                break
            if deadline is not None and now >= deadline:
                reason = FinishReason.TIME_LIMIT
                break
    finally:
        stream.tokens.close()
    if reason is not FinishReason.STOP_SEQUENCE:
        yield from _delta(assembler.flush())
    yield Finished(
        finish_reason=reason,
        stop_sequence=stop_sequence,
        usage=Usage(
            prompt_tokens=len(plan.prompt_ids),
            completion_tokens=progress.completion_tokens,
            cached_prompt_tokens=stream.cached_prompt_tokens,
        ),
        timing=progress.timing(time.monotonic()),
        seed=plan.sampling.seed,
    )
