"""The batch half of the decode loop: one step at a time over every active sequence.

Each loaded text model has one scheduler, run by the model's worker thread
between other calls (see `ModelWorker.attach`); its engine hands it requests
and where each one's events go (an `EventSink`). A step:
1. drops requests whose client went away (they free their place at once);
2. lets waiting requests join while the backend has room (a place in the
   batch and cache space for prompt + max_tokens);
3. advances every active sequence by one backend step (a decode token, or a
   chunk of a prompt still being evaluated);
4. hands each sampled token to that request's `SequenceDecoder`, which owns its
   stop rules, max_tokens, deadline and events; finished requests leave.

Where the model computes off the CPU, step 4 for one step's tokens runs during
the next step's forward pass, on the backend's thread beside it (see
`SequenceStepper.step`): detokenizing, stop rules and the responses then cost
the GPU no idle time. The price: a request that a stop sequence (or its wall-clock
ceiling) ends has been put in that next step already, so the model evaluates one
token it did not need to; its sequence is released once that step is done.

A cancel that leaves no request of the step in progress wanted interrupts it
(`SequenceStepper.interrupt_step`): llama.cpp on the CPU stops between two nodes
of its graph, rather than finishing a prompt chunk nobody waits for.

Requests beyond the waiting bound are refused at once with RESOURCE_EXHAUSTED.

Failures are told apart by where they happen (see `service.backends.failure`):
- the library failing to start a sequence fails that request alone;
- the library failing a step, or releasing a sequence, leaves the model in an
  unknown state: every running request gets BackendFailure, those waiting get
  UNAVAILABLE, new ones are refused, and `on_failure` tells the pool to discard
  the model (a fresh copy serves the next request);
- a bug of ours fails the requests it touched with the exception itself, which
  the RPC layer answers with INTERNAL and logs with its traceback; the model
  stays loaded.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import structlog

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
from service.backends.failure import RELOADING, library_failure
from service.decode.chunking import StreamChunker
from service.decode.sequence import DecodeEvent, DecodePlan, SequenceDecoder
from service.decode.sink import EventSink
from service.errors import NotSupported, Overloaded, ServiceError, Unavailable

log = structlog.get_logger("scheduler")


Sink = EventSink[DecodeEvent]


def nothing_to_publish() -> None:
    """The default `publish`: sinks that deliver each event as it is sent."""


@dataclass
class _Request:
    plan: DecodePlan
    received_at: float
    channel: Sink
    chunker: StreamChunker
    sequence: ActiveSequence | None = None
    decoder: SequenceDecoder | None = None
    retired: bool = False  # out of the batch: a token sampled for it since is dropped


@dataclass(frozen=True)
class _End:
    """The end of a stream in the outbox: cleanly, or with `error`."""

    error: Exception | None = None


class DecodeScheduler:
    def __init__(
        self,
        backend: TextBackend,
        max_waiting: int,
        stream_interval: int = 1,
        *,
        name: str = "",
        on_failure: Callable[[str], None] | None = None,
        publish: Callable[[], None] = nothing_to_publish,
    ) -> None:
        self._backend = backend
        self._stepper = as_stepper(backend)
        self._max_waiting = max_waiting
        # Tokens per streamed message after the first (see decode/chunking.py).
        self._stream_interval = stream_interval
        self._name = name
        # Called on the worker thread, with the reason, when the library failed a
        # step: the model's state is unknown and it must not serve again.
        self._on_failure = on_failure
        # Called after each flush: sinks that batch (frames to the front) send then.
        self._publish = publish
        self._waiting: deque[_Request] = deque()
        self._active: list[_Request] = []
        self._failure: str | None = None
        # Events and stream ends waiting for the next flush, in order.
        self._outbox: list[tuple[Sink, DecodeEvent | _End]] = []
        # The last step's tokens, until they are handed to their requests.
        self._undelivered: list[tuple[_Request, Sampled]] = []
        # Set while the work between steps runs beside a forward pass: sequences
        # retired then are released (`_unreleased`) once the step is done, since
        # the backend's cache must not change under the forward pass.
        self._beside_forward = False
        self._unreleased: list[_Request] = []
        self._error_beside: Exception | None = None
        # The requests of the step in progress, read by the threads that cancel them:
        # a step whose every request was cancelled is interrupted (`_heard_cancel`).
        self._in_flight: tuple[_Request, ...] = ()
        self._in_flight_lock = threading.Lock()

    @property
    def max_sequences(self) -> int:
        return self._stepper.max_sequences

    @property
    def computes_off_cpu(self) -> bool:
        return self._stepper.computes_off_cpu

    @property
    def running(self) -> int:
        """Requests in the batch now (read from any thread: a snapshot)."""
        return len(self._active)

    @property
    def waiting(self) -> int:
        """Requests waiting for a place in the batch (a snapshot, like `running`)."""
        return len(self._waiting)

    # --- on the worker thread ---------------------------------------------------------

    def enqueue(self, plan: DecodePlan, received_at: float, sink: Sink) -> None:
        """Queue one generation; its events go to `sink`, and setting the sink's
        `cancelled` ends it early."""
        self._enqueue(_Request(plan, received_at, sink, StreamChunker(self._stream_interval)))
        self._publish()  # a refusal goes out at once

    def step(self) -> bool:
        """One scheduler step; whether there is more work.

        Events go out just before the next forward pass rather than as they are
        made, so that with a GPU the event loop handles them while the model
        computes (see `Channel`).
        """
        try:
            self._drop_cancelled()
            self._admit_waiting()
            if self._active:
                self._advance()
        except Exception as exc:  # a bug of ours: its requests fail, the model stays
            self._end_running(exc)
        more = bool(self._active or self._waiting)
        if not more:
            self._flush()
        return more

    def _flush(self) -> None:
        outbox, self._outbox = self._outbox, []
        broken: list[Sink] = []
        for channel, item in outbox:
            if any(channel is sink for sink in broken):
                continue
            try:
                if isinstance(item, _End):
                    channel.close(item.error)
                else:
                    channel.send(item)
            except Exception as exc:  # a bug of ours in one request's events: it alone fails
                broken.append(channel)
                self._sending_failed(channel, exc)
        self._publish()

    def _sending_failed(self, channel: Sink, error: Exception) -> None:
        """Its request leaves the batch and its stream ends with `error`; the others go on."""
        log.error("sending a request's events failed", model=self._name, exc_info=error)
        request = next((r for r in self._active if r.channel is channel), None)
        if request is not None and self._failure is None:
            self._take_out(request)
        try:
            channel.close(error)
        except Exception:
            log.warning("closing a failed request's stream failed", exc_info=True)

    def abort(self, reason: str) -> None:
        """End every request, running or waiting, with UNAVAILABLE; refuse new ones.

        Called before the backend closes (unloading, shutdown past the grace period).
        """
        for request in self._active:
            self._finish_quietly(request)
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
        """Places in the batch that a request may take at the next step: a cancelled
        request leaves its place then (its cancel may have arrived just before)."""
        staying = sum(1 for request in self._active if not request.channel.cancelled.is_set())
        return max(self._stepper.max_sequences - staying, 0)

    def _drop_cancelled(self) -> None:
        for request in [r for r in self._active if r.channel.cancelled.is_set()]:
            if self._failure is None:  # retiring one may have failed the model
                self._retire(request)
        for request in [r for r in self._waiting if r.channel.cancelled.is_set()]:
            self._waiting.remove(request)
            # Ended, so the engine forgets it (its sink, its log line) as it would a
            # running one's; nobody reads the stream any more.
            self._outbox.append((request.channel, _End()))

    def _admit_waiting(self) -> None:
        while self._waiting and len(self._active) < self._stepper.max_sequences:
            request = self._waiting[0]
            try:
                sequence = self._start(request.plan)
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
            self._active.append(request)
            request.channel.cancelled.when_set(self._heard_cancel)
            try:
                request.decoder = SequenceDecoder(
                    self._backend, request.plan, request.received_at, sequence.cached_prompt_tokens
                )
            except Exception as exc:  # a bug of ours: this request fails, the others go on
                self._retire(request, exc)
                if self._failure is not None:
                    return

    def _start(self, plan: DecodePlan) -> ActiveSequence | None:
        """The library's start; its failure is this request's, not the model's: nothing
        ran yet, so the model serves the others on."""
        try:
            return self._stepper.start(plan.sequence)
        except ServiceError:
            raise
        except Exception as exc:
            raise library_failure(
                f"model {self._name!r} could not start this request", exc
            ) from exc

    def _advance(self) -> None:
        active = list(self._active)
        self._set_in_flight(active)
        try:
            tokens = self._stepper.step([_sequence(r) for r in active], self._between_steps)
        except Exception as exc:  # the library's: the model's state is unknown now
            self._unreleased.clear()
            self._fail_model(exc)
            return
        finally:
            self._set_in_flight([])
        self._release_retired()
        if self._error_beside is not None:
            error, self._error_beside = self._error_beside, None
            raise error
        self._undelivered = [
            (request, sampled)
            for request, sampled in zip(active, tokens, strict=True)
            if sampled is not None and not request.retired
        ]
        if not self._stepper.computes_off_cpu:  # nothing to overlap with: hand them out now
            self._deliver_undelivered()

    def _set_in_flight(self, requests: list[_Request]) -> None:
        """Begin (with its requests) or end (with none) a step; a step begun is checked
        at once, for cancels heard since the cancelled were dropped."""
        with self._in_flight_lock:
            self._in_flight = tuple(requests)
            self._stepper.interrupt_step(False)
        if requests:
            self._heard_cancel()

    def _heard_cancel(self) -> None:
        """A request was cancelled (on the thread that cancelled it): once no request in
        the step in progress is still wanted, the step stops mid-pass where the backend
        can. A prompt's chunk takes seconds on a busy CPU, and every cancel waited for
        it: the freed place, the waiting requests, the next cancel."""
        with self._in_flight_lock:
            requests = self._in_flight
            if requests and all(r.channel.cancelled.is_set() for r in requests):
                self._stepper.interrupt_step(True)

    def _between_steps(self) -> None:
        """Hand out the last step's tokens and send the events, while (on a GPU)
        the model computes the next step; an error waits for the step's end."""
        self._beside_forward = True
        try:
            self._deliver_undelivered()
            self._flush()
        except Exception as exc:  # a bug of ours: raised on the worker once the step ends
            self._error_beside = exc
        finally:
            self._beside_forward = False

    def _deliver_undelivered(self) -> None:
        undelivered, self._undelivered = self._undelivered, []
        for request, sampled in undelivered:
            if self._failure is not None:  # retiring an earlier one failed the model
                return
            if not request.retired:
                self._deliver(request, sampled)

    def _release_retired(self) -> None:
        unreleased, self._unreleased = self._unreleased, []
        for request in unreleased:
            if self._failure is None:  # releasing an earlier one may have failed the model
                self._release(request)

    def _deliver(self, request: _Request, sampled: Sampled) -> None:
        decoder = request.decoder
        assert decoder is not None  # set when the request became active
        if sampled.refused is not None:  # this sequence cannot go on; the others can
            self._retire(request, sampled.refused)
            return
        try:
            for each in sampled.run:  # several when the step verified drafted tokens
                for event in decoder.push(each.token, each.logprob, each.in_graph):
                    for message in request.chunker.push(event):
                        self._outbox.append((request.channel, message))
                if decoder.done:  # the rest of the run is past its end: never sent
                    break
        except Exception as exc:  # a bug of ours: this request fails, the others go on
            self._retire(request, exc)
            return
        if decoder.done:
            self._retire(request)

    def _retire(self, request: _Request, error: Exception | None = None) -> None:
        """Take a request out of the batch, ending its stream (with `error` if set)
        after what it already produced, and release its sequence."""
        self._take_out(request)
        self._outbox.append((request.channel, _End(error)))

    def _take_out(self, request: _Request) -> None:
        """Take a request out of the batch and release its sequence (after the step
        running beside this, if any)."""
        self._active.remove(request)
        request.retired = True
        if self._beside_forward:
            self._unreleased.append(request)
        else:
            self._release(request)

    def _release(self, request: _Request) -> None:
        try:
            self._stepper.finish(_sequence(request))
        except Exception as exc:  # the library's: the model's cache state is unknown
            self._fail_model(exc)

    def _finish_quietly(self, request: _Request) -> None:
        """Release a sequence of a batch that ends anyway; a failure changes nothing."""
        try:
            self._stepper.finish(_sequence(request))
        except Exception:
            log.warning("releasing a sequence failed", model=self._name, exc_info=True)

    def _send_held(self) -> None:
        """Queue the deltas each running request still holds back for its next message."""
        for request in self._active:
            for message in request.chunker.drain():
                self._outbox.append((request.channel, message))

    def _fail_model(self, error: Exception) -> None:
        """The library failed a step: end everything, and have the model discarded."""
        failure = library_failure(f"model {self._name!r} failed while generating", error, RELOADING)
        if self._on_failure is not None:  # first, so the pool drops it before clients hear
            self._on_failure(failure.message)
        self._end_all(f"model {self._name!r} failed and is being reloaded", failure)

    def _end_running(self, error: Exception) -> None:
        """A bug of ours struck mid-step: the running requests end with it; those
        waiting stay, and the model serves on."""
        log.error("scheduler step failed", model=self._name, exc_info=error)
        self._undelivered.clear()
        for request in list(self._active):
            self._outbox.append((request.channel, _End(error)))
            if request.sequence is not None:
                self._finish_quietly(request)
        self._active.clear()
        self._flush()

    def _end_all(self, reason: str, running_error: Exception) -> None:
        """Close every request, running ones with `running_error`, waiting ones with
        UNAVAILABLE, and refuse new ones for `reason`. What was produced before still
        goes out first."""
        self._undelivered.clear()  # their requests end with the error instead
        self._send_held()
        self._flush()
        self._failure = reason
        for request in self._active:
            request.channel.close(running_error)
        for request in self._waiting:
            request.channel.close(Unavailable(f"{reason}; retry"))
        self._active.clear()
        self._waiting.clear()
        self._publish()


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
        stream = self._backend.generate(request.prompt_ids, request.sampling)
        self._busy = True  # only once it started: a failed start must not hold the place
        return _Streaming(stream)

    def step(
        self, sequences: Sequence[ActiveSequence], before_compute: Callable[[], None]
    ) -> list[Sampled | None]:
        before_compute()
        return [Sampled(self._next_token(sequence)) for sequence in sequences]

    def finish(self, sequence: ActiveSequence) -> None:
        self._streaming(sequence).stream.tokens.close()
        self._busy = False

    def interrupt_step(self, interrupted: bool) -> None:
        """A stream's token comes whole: nothing to stop."""

    def _next_token(self, sequence: ActiveSequence) -> int:
        token = next(self._streaming(sequence).stream.tokens, None)
        if token is None:
            raise RuntimeError("the backend's token stream ended before the request did")
        return token

    @staticmethod
    def _streaming(sequence: ActiveSequence) -> _Streaming:
        assert isinstance(sequence, _Streaming)
        return sequence
