"""The per-request half of the decode loop shared by every text backend.

`plan_decode` checks that a prompt fits the context window and fixes the
length budget. `SequenceDecoder` owns everything about one request that must
behave the same whatever library runs the model: end-of-generation tokens,
stop sequences, max_tokens, the wall-clock ceiling, time-to-first-token and
usage counts. The scheduler (`service.decode.scheduler`) feeds it the tokens a
backend sampled, one at a time.

Everything here runs on the model's worker thread.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

from service.backends.base import SequenceRequest, TextBackend
from service.decode.text import Released, TextAssembler
from service.errors import ContextOverflow
from service.text.requests import (
    Delta,
    Finished,
    FinishReason,
    SamplingParams,
    Timing,
    TokenLogprob,
    Usage,
)

DecodeEvent = Delta | Finished


@dataclass(frozen=True)
class DecodePlan:
    """One request as the decode loop runs it: what the backend evaluates and
    samples (`sequence`, handed to it as it is), and what the loop enforces itself."""

    sequence: SequenceRequest
    stop: tuple[str, ...]
    # Wall-clock ceiling on decoding, in seconds; None for no ceiling.
    time_limit_s: float | None

    @property
    def prompt_ids(self) -> tuple[int, ...]:
        return self.sequence.prompt_ids

    @property
    def max_tokens(self) -> int:
        return self.sequence.max_tokens

    @property
    def sampling(self) -> SamplingParams:
        return self.sequence.sampling


def fit_max_tokens(
    prompt_tokens: int, requested: int | None, default: int, context_length: int
) -> int:
    """The completion budget, or ContextOverflow when the prompt does not fit.

    The message says it in the words client libraries recognise an overflow by:
    OpenAI's "This model's maximum context length is" (litellm) and "prompt is too
    long" (LangChain, which reads the exception's text, where the openai SDK puts the
    message and not the code), besides the numbers."""
    room = context_length - prompt_tokens
    if room < 1:
        raise ContextOverflow(
            f"This model's maximum context length is {context_length} tokens; the prompt "
            f"is too long: its {prompt_tokens} tokens leave no room in the context window "
            "to generate. Shorten the prompt."
        )
    if requested is None:
        return min(default, room)
    if requested > room:
        raise ContextOverflow(
            f"This model's maximum context length is {context_length} tokens; the prompt "
            f"is too long for max_tokens: prompt ({prompt_tokens} tokens) + max_tokens "
            f"({requested}) exceeds the context window. Ask for at most {room} tokens or "
            "shorten the prompt."
        )
    return requested


@dataclass
class _Progress:
    """Clock readings of one request (time.monotonic seconds)."""

    received_at: float
    started_at: float
    completion_tokens: int = 0
    sampled_in_graph: int = 0  # of completion_tokens
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


class SequenceDecoder:
    """Turns one request's sampled tokens into events, and decides when it ends.

    Created when the request gets a place in the batch (so `queue_ms` counts
    the wait before it); `push` takes each sampled token and returns the events
    to send, the last of them `Finished` once the request is done.
    """

    def __init__(
        self, backend: TextBackend, plan: DecodePlan, received_at: float, cached_prompt_tokens: int
    ) -> None:
        self._backend = backend
        self._plan = plan
        self._cached = cached_prompt_tokens
        self._progress = _Progress(received_at=received_at, started_at=time.monotonic())
        limit = plan.time_limit_s
        self._deadline = None if limit is None else self._progress.started_at + limit
        self._assembler = TextAssembler(plan.stop)
        # One entry per token the assembler still holds back, in order (None
        # when the request did not ask for logprobs), so they leave with their ids.
        self._held_logprobs: list[TokenLogprob | None] = []
        self.done = False

    def push(
        self, token: int, logprob: TokenLogprob | None = None, in_graph: bool = False
    ) -> list[DecodeEvent]:
        now = time.monotonic()
        progress = self._progress
        if progress.first_token_at is None:
            progress.first_token_at = now
        if self._backend.is_end_of_generation(token):
            return self._finish(FinishReason.END_OF_TURN)
        # Counted even when it turns out to be part of a stop and is never streamed.
        progress.completion_tokens += 1
        progress.sampled_in_graph += in_graph
        self._held_logprobs.append(logprob)
        released = self._assembler.push(token, self._backend.token_bytes(token))
        events: list[DecodeEvent] = list(self._delta(released))
        if released.stop_sequence is not None:
            return events + self._finish(FinishReason.STOP_SEQUENCE, released.stop_sequence)
        if progress.completion_tokens >= self._plan.max_tokens:
            return events + self._finish(FinishReason.LENGTH)
        if self._deadline is not None and now >= self._deadline:
            return events + self._finish(FinishReason.TIME_LIMIT)
        return events

    def _finish(self, reason: FinishReason, stop_sequence: str = "") -> list[DecodeEvent]:
        self.done = True
        events: list[DecodeEvent] = []
        if reason is not FinishReason.STOP_SEQUENCE:
            events.extend(self._delta(self._assembler.flush()))
        usage = Usage(
            prompt_tokens=len(self._plan.prompt_ids),
            completion_tokens=self._progress.completion_tokens,
            cached_prompt_tokens=self._cached,
            sampled_in_graph_tokens=self._progress.sampled_in_graph,
        )
        events.append(
            Finished(
                finish_reason=reason,
                stop_sequence=stop_sequence,
                usage=usage,
                timing=self._progress.timing(time.monotonic()),
                seed=self._plan.sampling.seed,
            )
        )
        return events

    def _delta(self, released: Released) -> Iterator[Delta]:
        # The assembler releases its oldest tokens first and drops all the rest
        # at a stop, so the logprobs of the released ids are the oldest held.
        count = len(released.token_ids)
        sent = [entry for entry in self._held_logprobs[:count] if entry is not None]
        if released.stop_sequence is not None:
            self._held_logprobs.clear()
        else:
            del self._held_logprobs[:count]
        # A token with no text of its own (a special token) still goes out.
        if released.text or released.token_ids:
            yield Delta(released.text, released.token_ids, tuple(sent))
