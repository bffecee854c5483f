"""The batch half of the decode loop: one step at a time over every active sequence.

Each loaded text model has one scheduler, run by the model's worker thread
between other calls (see `ModelWorker.attach`). A step:
1. drops requests whose client went away (they free their place at once);
2. lets waiting requests join while the backend has room (a place in the
   batch and cache space for prompt + max_tokens);
3. advances every active sequence by one backend step (a decode token, or a
   chunk of a prompt still being evaluated);
4. hands each sampled token to that request's `SequenceDecoder`, which owns its
   stop rules, max_tokens, deadline and events; finished requests leave.

Requests beyond the waiting bound are refused at once with RESOURCE_EXHAUSTED.
A backend step that raises fails every request in the batch with that error
(the pool then discards the model) and those still waiting with UNAVAILABLE.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

from service.backends.base import (
    ActiveSequence,
    BatchingBackend,
    Sampled,
    SequenceRequest,
    SequenceStepper,
    StreamingBackend,
    TextBackend,
    TokenStream,
)
from service.decode.chunking import StreamChunker
from service.decode.loop import DecodeEvent, DecodePlan, SequenceDecoder
from service.errors import NotSupported, Overloaded, ServiceError, Unavailable
from service.models.worker import Channel, ModelWorker


@dataclass
class _Request:
    plan: DecodePlan
    received_at: float
    channel: Channel[DecodeEvent]
    chunker: StreamChunker
    sequence: ActiveSequence | None = None
    decoder: SequenceDecoder | None = None


class DecodeScheduler:
    def __init__(
        self,
        backend: TextBackend,
        worker: ModelWorker,
        max_waiting: int,
        stream_interval: int = 1,
    ) -> None:
        self._backend = backend
        self._stepper = as_stepper(backend)
        self._worker = worker
        self._max_waiting = max_waiting
        # Tokens per streamed message after the first (see decode/chunking.py).
        self._stream_interval = stream_interval
        self._waiting: deque[_Request] = deque()
        self._active: list[_Request] = []
        self._failure: str | None = None
        # Events (None: end of stream) waiting for the next flush, in order.
        self._outbox: list[tuple[Channel[DecodeEvent], DecodeEvent | None]] = []
        worker.attach(self.step)

    @property
    def max_sequences(self) -> int:
        return self._stepper.max_sequences

    async def stream(self, plan: DecodePlan, received_at: float) -> AsyncIterator[DecodeEvent]:
        """The events of one generation; stopping early cancels it."""
        relayed = self._stepper.computes_off_cpu
        channel: Channel[DecodeEvent] = Channel(asyncio.get_running_loop(), relayed)
        request = _Request(plan, received_at, channel, StreamChunker(self._stream_interval))
        self._worker.submit(lambda: self._enqueue(request))
        async for event in channel:
            yield event

    # --- on the worker thread ---------------------------------------------------------

    def step(self) -> bool:
        """One scheduler step; whether there is more work.

        Events go out just before the next forward pass rather than as they are
        made, so that with a GPU the event loop handles them while the model
        computes (see `Channel`).
        """
        self._drop_cancelled()
        self._admit_waiting()
        if self._active:
            self._advance()
        more = bool(self._active or self._waiting)
        if not more:
            self._flush()
        return more

    def _flush(self) -> None:
        outbox, self._outbox = self._outbox, []
        for channel, event in outbox:
            if event is None:
                channel.close()
            else:
                channel.send(event)

    def abort(self, reason: str) -> None:
        """End every request, running or waiting, with UNAVAILABLE; refuse new ones.

        Called before the backend closes (unloading, shutdown past the grace period).
        """
        for request in self._active:
            self._stepper.finish(_sequence(request))
        self._end_all(reason, running_error=Unavailable(f"{reason}; retry"))

    def _enqueue(self, request: _Request) -> None:
        if self._failure is not None:
            request.channel.close(Unavailable(self._failure))
        elif len(self._waiting) >= self._max_waiting + self._free_places():
            request.channel.close(
                Overloaded(
                    f"{len(self._active)} generations are running on this model and "
                    f"{len(self._waiting)} are waiting, the most allowed "
                    "(--max-waiting-sequences); retry later"
                )
            )
        else:
            self._waiting.append(request)

    def _free_places(self) -> int:
        """Places in the batch that a request may take at the next step."""
        return max(self._stepper.max_sequences - len(self._active), 0)

    def _drop_cancelled(self) -> None:
        for request in [r for r in self._active if r.channel.cancelled.is_set()]:
            self._retire(request)
        self._waiting = deque(r for r in self._waiting if not r.channel.cancelled.is_set())

    def _admit_waiting(self) -> None:
        while self._waiting and len(self._active) < self._stepper.max_sequences:
            request = self._waiting[0]
            plan = request.plan
            try:
                sequence = self._stepper.start(_sequence_request(plan))
            except ServiceError as exc:  # this request cannot run; the others can
                self._waiting.popleft().channel.close(exc)
                continue
            if sequence is None:
                if not self._active:  # nothing will ever free room for it
                    self._waiting.popleft().channel.close(
                        Overloaded("the model's cache has no room for this request")
                    )
                    continue
                return  # first come, first served: wait until room frees
            self._waiting.popleft()
            request.sequence = sequence
            request.decoder = SequenceDecoder(
                self._backend, plan, request.received_at, sequence.cached_prompt_tokens
            )
            self._active.append(request)

    def _advance(self) -> None:
        active = list(self._active)
        try:
            tokens = self._stepper.step([_sequence(r) for r in active], self._flush)
        except Exception as exc:
            self._fail_all(exc)
            return
        for request, sampled in zip(active, tokens, strict=True):
            if sampled is not None:
                self._deliver(request, sampled)

    def _deliver(self, request: _Request, sampled: Sampled) -> None:
        decoder = request.decoder
        assert decoder is not None  # set when the request became active
        for event in decoder.push(sampled.token, sampled.logprob):
            for message in request.chunker.push(event):
                self._outbox.append((request.channel, message))
        if decoder.done:
            self._retire(request)

    def _retire(self, request: _Request) -> None:
        self._active.remove(request)
        self._stepper.finish(_sequence(request))
        self._outbox.append((request.channel, None))

    def _send_held(self) -> None:
        """Queue the deltas each running request still holds back for its next message."""
        for request in self._active:
            for message in request.chunker.drain():
                self._outbox.append((request.channel, message))

    def _fail_all(self, error: Exception) -> None:
        reason = f"the model failed while generating ({error}); it is being reloaded"
        self._end_all(reason, running_error=error)

    def _end_all(self, reason: str, running_error: Exception) -> None:
        """Close every request, running ones with `running_error`, waiting ones with
        UNAVAILABLE, and refuse new ones for `reason`. What was produced before still
        goes out first."""
        self._send_held()
        self._flush()
        self._failure = reason
        for request in self._active:
            request.channel.close(running_error)
        for request in self._waiting:
            request.channel.close(Unavailable(f"{reason}; retry"))
        self._active.clear()
        self._waiting.clear()


def _sequence_request(plan: DecodePlan) -> SequenceRequest:
    return SequenceRequest(
        prompt_ids=plan.prompt_ids,
        sampling=plan.sampling,
        max_tokens=plan.max_tokens,
        grammar=plan.grammar,
        top_logprobs=plan.top_logprobs,
    )


def _sequence(request: _Request) -> ActiveSequence:
    assert request.sequence is not None  # set when the request became active
    return request.sequence


def as_stepper(backend: TextBackend) -> SequenceStepper:
    if isinstance(backend, BatchingBackend):
        return backend
    if isinstance(backend, StreamingBackend):
        return OneAtATime(backend)
    raise TypeError(f"{type(backend).__name__} neither batches nor streams tokens")


@dataclass
class _Streaming:
    stream: TokenStream

    @property
    def cached_prompt_tokens(self) -> int:
        return self.stream.cached_prompt_tokens


class OneAtATime:
    """A streaming backend seen as a batching one that holds a single sequence."""

    def __init__(self, backend: StreamingBackend) -> None:
        self._backend = backend
        self._busy = False

    @property
    def max_sequences(self) -> int:
        return 1

    @property
    def computes_off_cpu(self) -> bool:
        return False

    def start(self, request: SequenceRequest) -> ActiveSequence | None:
        if request.grammar is not None or request.top_logprobs is not None:
            raise NotSupported(
                f"the {self._backend.name} backend does not constrain output with a grammar "
                "or report logprobs; use a GGUF model (llama.cpp) for those"
            )
        if self._busy:
            return None
        self._busy = True
        return _Streaming(self._backend.generate(request.prompt_ids, request.sampling))

    def step(
        self, sequences: Sequence[ActiveSequence], before_compute: Callable[[], None]
    ) -> list[Sampled | None]:
        before_compute()
        return [Sampled(self._next_token(sequence)) for sequence in sequences]

    def finish(self, sequence: ActiveSequence) -> None:
        self._streaming(sequence).stream.tokens.close()
        self._busy = False

    def _next_token(self, sequence: ActiveSequence) -> int:
        token = next(self._streaming(sequence).stream.tokens, None)
        if token is None:
            raise RuntimeError("the backend's token stream ended before the request did")
        return token

    @staticmethod
    def _streaming(sequence: ActiveSequence) -> _Streaming:
        assert isinstance(sequence, _Streaming)
        return sequence
