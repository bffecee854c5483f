"""Concurrent Embed requests to one model, evaluated batch by batch on its worker thread.

A request's inputs are tokenized (and checked against the model's window and
vocabulary, and their sum against the request token budget) on the engine's
preparation thread, then queued on the worker. Each worker step evaluates one
batch: at most the model's sequences per evaluation and `batch_tokens` tokens
(never fewer than the window, so any one input fits), taken from the requests
waiting, those that have had the least evaluated first. So:

- sixteen clients sending one sentence each cost about what one client sending
  sixteen does: they share a batch;
- a request of 2,048 long inputs is some 250 steps, not one call of minutes: the
  worker counts each step as progress, which the stuck-engine watchdog
  (service.engine.liveness) sees, and a request arriving meanwhile is in the next
  batch instead of waiting for the whole of it;
- a request whose client left (it disconnected, its deadline passed) is dropped
  before the next batch, with whatever of it was left unrun.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from service.backends.failure import RELOADING, library_failure
from service.decode.sink import EventSink
from service.embeddings.backend import EmbeddingBackend
from service.embeddings.requests import Embedded, EmbedInput, Vector
from service.engine.options import EMBED_BATCH_TOKENS, REQUEST_TOKEN_BUDGET
from service.errors import InvalidRequest, ServiceError, Unavailable, excerpt

EmbedSink = EventSink[Embedded]


@dataclass
class EmbedJob:
    """One request, tokenized: its inputs' ids, which were cut, and where it goes; and
    the vectors of the inputs evaluated so far, in order."""

    ids: list[list[int]]
    truncated: list[bool]
    normalize: bool
    sink: EmbedSink
    vectors: list[Vector] = field(default_factory=list)
    tokens_done: int = 0

    @property
    def done(self) -> bool:
        return len(self.vectors) == len(self.ids)


@dataclass(frozen=True)
class Batch:
    """One evaluation: (job, how many of its next inputs) in the order they are read."""

    parts: tuple[tuple[EmbedJob, int], ...]

    def inputs(self) -> list[list[int]]:
        return [
            ids
            for job, count in self.parts
            for ids in job.ids[len(job.vectors) : len(job.vectors) + count]
        ]


def over_budget(
    what: str, budget: int, advice: str = "split them over several requests"
) -> InvalidRequest:
    """The refusal of a request whose tokens pass the request token budget; `what`
    says how many it holds ("the first 9 of 12 inputs hold 300,112 tokens")."""
    return InvalidRequest(
        f"{what}, past the request token budget of {budget:,} (--request-token-budget): {advice}"
    )


def tokenized(
    backend: EmbeddingBackend,
    inputs: Sequence[EmbedInput],
    truncate: bool,
    budget: int = REQUEST_TOKEN_BUDGET,
    cancelled: threading.Event | None = None,
) -> tuple[list[list[int]], list[bool]]:
    """Each input's ids as the model reads them, and whether it was cut to the window;
    INVALID_ARGUMENT for an id outside the vocabulary, an input too long to read whole
    when the request did not allow cutting, or inputs whose tokens (as read, after
    cutting) pass `budget` together: tokenizing stops there, so a refused request costs
    at most the budget's tokens. Stops early, with what it has, once `cancelled` is set
    (the client left: nobody reads the refusal or the vectors; the caller checks)."""
    window, vocabulary = backend.context_length, backend.vocab_size
    ids, truncated = [], []
    total = 0
    for index, item in enumerate(inputs):
        if cancelled is not None and cancelled.is_set():
            break
        tokens = backend.tokenize(item.text) if item.text is not None else list(item.tokens or ())
        outside = next((token for token in tokens if not 0 <= token < vocabulary), None)
        if outside is not None:
            raise InvalidRequest(
                f"input {index} holds token id {outside}, outside the model's vocabulary of "
                f"{vocabulary}"
            )
        if len(tokens) > window and not truncate:
            what = f"{excerpt(item.text)} is" if item.text is not None else "its ids are"
            raise InvalidRequest(
                f"input {index} ({what} {len(tokens)} tokens) is longer than the model's "
                f"window of {window} tokens; shorten it, or set truncate to keep its first "
                f"{window}"
            )
        total += min(len(tokens), window)
        if total > budget:
            held = f"the first {index + 1} of {len(inputs)} inputs hold {total:,} tokens"
            raise over_budget(held, budget)
        ids.append(tokens[:window])
        truncated.append(len(tokens) > window)
    return ids, truncated


def next_batch(jobs: Sequence[EmbedJob], max_inputs: int, max_tokens: int) -> Batch:
    """The inputs of the next evaluation: at most `max_inputs` of them and `max_tokens`
    tokens (the first input always goes in, whatever its length), taken from the jobs
    that have had the fewest tokens evaluated first (a job's own in order), so a short
    request that arrives while a long one runs is in the next batch."""
    parts: list[tuple[EmbedJob, int]] = []
    inputs = tokens = 0
    for job in sorted(jobs, key=lambda job: job.tokens_done):  # stable: first come first
        count = 0
        for ids in job.ids[len(job.vectors) :]:
            if inputs == max_inputs or (inputs and tokens + len(ids) > max_tokens):
                break
            count += 1
            inputs += 1
            tokens += len(ids)
        if count:
            parts.append((job, count))
        if inputs == max_inputs:
            break
    return Batch(tuple(parts))


class EmbedQueue:
    """The requests waiting for their next evaluation; used on the worker thread only."""

    def __init__(
        self,
        backend: EmbeddingBackend,
        on_failure: Callable[[str], None],
        publish: Callable[[], None],
        batch_tokens: int = EMBED_BATCH_TOKENS,
    ) -> None:
        """`publish` sends what the sinks batched (an engine process's frames)."""
        self._backend = backend
        self._on_failure = on_failure
        self._publish = publish
        self._batch_tokens = max(batch_tokens, backend.context_length)
        self._jobs: list[EmbedJob] = []
        self.evaluations = 0  # steps that evaluated something

    @property
    def waiting(self) -> int:
        return len(self._jobs)

    def add(self, job: EmbedJob) -> None:
        self._jobs.append(job)
        self._publish()  # the front's view of the load: one more waiting

    def abort(self, reason: str) -> None:
        """End every waiting request with UNAVAILABLE and `reason` (the model closes)."""
        self._fail(Unavailable(reason))

    def step(self) -> bool:
        """Evaluate one batch of the waiting requests' inputs; whether more wait."""
        ended = self._drop_cancelled()
        batch = next_batch(self._jobs, self._backend.max_sequences, self._batch_tokens)
        if batch.parts:
            self.evaluations += 1
            ended = self._evaluate(batch) or ended
        if ended:
            self._publish()
        return bool(self._jobs)

    def _drop_cancelled(self) -> bool:
        """End the requests nobody listens to any more (the front ended them already)
        unrun; whether there were any."""
        live = [job for job in self._jobs if not job.sink.cancelled.is_set()]
        if len(live) == len(self._jobs):
            return False
        for job in self._jobs:
            if job.sink.cancelled.is_set():
                job.sink.close()
        self._jobs = live
        return True

    def _evaluate(self, batch: Batch) -> bool:
        """Evaluate `batch`, handing each job its vectors; whether a job ended."""
        try:
            vectors = self._backend.embed(batch.inputs())
        except Exception as exc:  # the library failed: its state is unknown
            failure = library_failure(f"{self._backend.name} embedding", exc, RELOADING)
            self._fail(failure)  # every waiting request needs the same broken model
            self._on_failure(str(failure))
            return True
        start = 0
        for job, count in batch.parts:
            mine = vectors[start : start + count]
            start += count
            job.tokens_done += sum(map(len, job.ids[len(job.vectors) : len(job.vectors) + count]))
            job.vectors.extend(mine)
        finished = [job for job, _ in batch.parts if job.done]
        for job in finished:
            self._jobs.remove(job)
            self._answer(job)
        return bool(finished)

    def _answer(self, job: EmbedJob) -> None:
        vectors = [_unit(vector) for vector in job.vectors] if job.normalize else job.vectors
        job.sink.send(
            Embedded(
                vectors,
                [len(ids) for ids in job.ids],
                job.truncated,
                self._backend.pooling,
                job.normalize,
            )
        )
        job.sink.close()

    def _fail(self, error: ServiceError) -> None:
        jobs, self._jobs = self._jobs, []
        for job in jobs:
            job.sink.close(error)
        self._publish()


def _unit(vector: Vector) -> Vector:
    """The vector at length 1 (a zero vector stays zero)."""
    norm = float(np.linalg.norm(vector))
    return vector / norm if norm > 0 else vector
