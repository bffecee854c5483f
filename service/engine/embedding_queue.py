"""Concurrent Embed requests to one model, evaluated together on its worker thread.

A request's inputs are tokenized (and checked against the model's window and
vocabulary) on the engine's preparation thread, then queued on the worker. Each
worker step takes every request queued since the last one and evaluates all
their inputs together, in as few of the model's evaluations as its step allows:
sixteen clients sending one sentence each cost about what one client sending
sixteen does. A request whose client left while it waited is dropped unrun.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from service.backends.failure import RELOADING, library_failure
from service.decode.sink import EventSink
from service.embeddings.backend import EmbeddingBackend
from service.embeddings.requests import Embedded, EmbedInput, Vector
from service.errors import InvalidRequest, Unavailable, excerpt

EmbedSink = EventSink[Embedded]


@dataclass
class EmbedJob:
    """One request, tokenized: its inputs' ids, which were cut, and where it goes."""

    ids: list[list[int]]
    truncated: list[bool]
    normalize: bool
    sink: EmbedSink


def tokenized(
    backend: EmbeddingBackend, inputs: Sequence[EmbedInput], truncate: bool
) -> tuple[list[list[int]], list[bool]]:
    """Each input's ids as the model reads them, and whether it was cut to the window;
    INVALID_ARGUMENT for an id outside the vocabulary, or an input too long to read
    whole when the request did not allow cutting."""
    window, vocabulary = backend.context_length, backend.vocab_size
    ids, truncated = [], []
    for index, item in enumerate(inputs):
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
        ids.append(tokens[:window])
        truncated.append(len(tokens) > window)
    return ids, truncated


class EmbedQueue:
    """The requests waiting for the next evaluation; used on the worker thread only."""

    def __init__(
        self,
        backend: EmbeddingBackend,
        on_failure: Callable[[str], None],
        publish: Callable[[], None],
    ) -> None:
        """`publish` sends what the sinks batched (an engine process's frames)."""
        self._backend = backend
        self._on_failure = on_failure
        self._publish = publish
        self._jobs: list[EmbedJob] = []
        self.evaluations = 0  # steps that evaluated something

    @property
    def waiting(self) -> int:
        return len(self._jobs)

    def add(self, job: EmbedJob) -> None:
        self._jobs.append(job)

    def abort(self, reason: str) -> None:
        """End every waiting request with UNAVAILABLE and `reason` (the model closes)."""
        jobs, self._jobs = self._jobs, []
        for job in jobs:
            job.sink.close(Unavailable(reason))
        self._publish()

    def step(self) -> bool:
        """Evaluate every waiting request's inputs together; whether more wait."""
        jobs, self._jobs = self._jobs, []
        live = []
        for job in jobs:
            if job.sink.cancelled.is_set():
                job.sink.close()  # nobody listens; the front ended it already
            else:
                live.append(job)
        if live:
            self.evaluations += 1
            self._evaluate(live)
        if jobs:
            self._publish()
        return bool(self._jobs)

    def _evaluate(self, jobs: list[EmbedJob]) -> None:
        try:
            vectors = self._backend.embed([ids for job in jobs for ids in job.ids])
        except Exception as exc:  # the library failed: its state is unknown
            failure = library_failure(f"{self._backend.name} embedding", exc, RELOADING)
            for job in jobs:
                job.sink.close(failure)
            self._on_failure(str(failure))
            return
        start = 0
        for job in jobs:
            mine = vectors[start : start + len(job.ids)]
            start += len(job.ids)
            if job.normalize:
                mine = [_unit(vector) for vector in mine]
            job.sink.send(
                Embedded(
                    mine,
                    [len(ids) for ids in job.ids],
                    job.truncated,
                    self._backend.pooling,
                    job.normalize,
                )
            )
            job.sink.close()


def _unit(vector: Vector) -> Vector:
    """The vector at length 1 (a zero vector stays zero)."""
    norm = float(np.linalg.norm(vector))
    return vector / norm if norm > 0 else vector
