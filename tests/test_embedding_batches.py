"""An Embed request's work, bounded and in steps (issue 45, item 9), at the queue's seam.

No model: a backend that gives each input a vector naming it, and counts what it was
asked to evaluate. A request is refused past the request token budget while it is
tokenized, before anything is evaluated; it is evaluated in batches of the model's
sequences and the batch tokens, one per worker step (each step is progress for the
stuck-engine watchdog); a short request that arrives while a long one runs is in the
next batch; a request whose client left stops between batches.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from service.decode.sink import Cancellation
from service.embeddings.requests import Embedded, EmbedInput, Vector
from service.engine.embedding_queue import EmbedJob, EmbedQueue, next_batch, tokenized
from service.engine.liveness import Liveness, Pulse
from service.engine.model_options import ModelOptions
from service.engine.options import EMBED_BATCH_TOKENS, REQUEST_TOKEN_BUDGET, EngineOptions
from service.engine.worker import ModelWorker
from service.errors import BackendFailure, InvalidRequest, Unavailable
from tests.conftest import eventually, make_settings

WINDOW = 8


class Backend:
    """Words are tokens (id: the word's length); an input's vector is (its first id,
    its length), so a test can tell whose vector is whose."""

    def __init__(self, max_sequences: int = 4) -> None:
        self._max_sequences = max_sequences
        self.evaluated: list[list[list[int]]] = []
        self.tokenized = 0
        self.fail = False

    name = "fake-embeddings"
    context_length = WINDOW
    dimensions = 2
    vocab_size = 100
    pooling = "mean"

    @property
    def max_sequences(self) -> int:
        return self._max_sequences

    def tokenize(self, text: str) -> list[int]:
        self.tokenized += 1
        return [len(word) for word in text.split()]

    def embed(self, inputs: Sequence[Sequence[int]]) -> list[Vector]:
        if self.fail:
            raise RuntimeError("the library broke")
        self.evaluated.append([list(ids) for ids in inputs])
        return [np.array([ids[0], len(ids)], dtype=np.float32) for ids in inputs]

    def close(self) -> None:
        pass


class Sink:
    def __init__(self) -> None:
        self.cancelled = Cancellation()
        self.sent: list[Embedded] = []
        self.ended: BaseException | bool | None = False

    def send(self, item: Embedded) -> None:
        self.sent.append(item)

    def close(self, error: BaseException | None = None) -> None:
        self.ended = error


def _job(*lengths: int, first: int = 1) -> tuple[EmbedJob, Sink]:
    """A job of inputs of these lengths, the nth input's ids all `first + n`."""
    sink = Sink()
    ids = [[first + n] * length for n, length in enumerate(lengths)]
    return EmbedJob(ids, [False] * len(ids), False, sink), sink


def _queue(backend: Backend, batch_tokens: int = 16) -> tuple[EmbedQueue, list[int]]:
    published: list[int] = []
    failures: list[str] = []
    queue = EmbedQueue(backend, failures.append, lambda: published.append(1), batch_tokens)
    return queue, published


def _texts(*words: int) -> list[EmbedInput]:
    return [EmbedInput(text=" ".join(["word"] * count)) for count in words]


# --- the budget ---------------------------------------------------------------------------


def test_inputs_within_the_budget_are_tokenized_whole() -> None:
    ids, cut = tokenized(Backend(), _texts(3, 5), truncate=False, budget=8)
    assert [len(item) for item in ids] == [3, 5]
    assert cut == [False, False]


def test_past_the_budget_the_request_is_refused_naming_it_and_tokenizing_stops() -> None:
    backend = Backend()
    with pytest.raises(InvalidRequest) as caught:
        tokenized(backend, _texts(*[6] * 100), truncate=False, budget=20)
    message = caught.value.message
    assert "request token budget of 20" in message
    assert "--request-token-budget" in message
    assert "the first 4 of 100 inputs hold 24 tokens" in message
    assert backend.tokenized == 4  # not the 96 after it


def test_the_budget_counts_tokens_as_read_after_truncation() -> None:
    ids, cut = tokenized(Backend(), _texts(20, 20), truncate=True, budget=2 * WINDOW)
    assert [len(item) for item in ids] == [WINDOW, WINDOW]
    assert cut == [True, True]


def test_token_id_inputs_count_toward_the_budget() -> None:
    given = [EmbedInput(tokens=(1,) * 5)] * 3
    with pytest.raises(InvalidRequest, match="the first 3 of 3 inputs hold 15 tokens"):
        tokenized(Backend(), given, truncate=False, budget=14)


def test_tokenizing_stops_once_the_client_left() -> None:
    backend, cancelled = Backend(), threading.Event()
    cancelled.set()
    ids, _ = tokenized(backend, _texts(3, 3), truncate=False, cancelled=cancelled)
    assert (ids, backend.tokenized) == ([], 0)


def test_the_budget_and_batch_size_reach_the_engine_with_the_settings_defaults() -> None:
    settings = make_settings()
    assert settings.request_token_budget == REQUEST_TOKEN_BUDGET == 300_000
    assert settings.embed_batch_tokens == EMBED_BATCH_TOKENS
    # 2,048 inputs of the default embedding model's whole window pass the default budget:
    # refused at once, not evaluated for minutes on a CPU.
    assert REQUEST_TOKEN_BUDGET < 2048 * 512
    embedder = EngineOptions("m", "llama.cpp-embeddings", Path("/m.gguf"), ModelOptions(512, 1))
    options = EngineOptions.from_pb(embedder.to_pb())
    assert (options.request_token_budget, options.embed_batch_tokens) == (300_000, 4096)
    custom = replace(embedder, request_token_budget=7, embed_batch_tokens=9)
    assert EngineOptions.from_pb(custom.to_pb()) == custom


# --- the batches --------------------------------------------------------------------------


def test_a_batch_holds_at_most_the_sequences_and_the_tokens() -> None:
    job, _ = _job(*[3] * 10)
    batch = next_batch([job], max_inputs=4, max_tokens=100)
    assert batch.parts == ((job, 4),)
    batch = next_batch([job], max_inputs=64, max_tokens=10)
    assert batch.parts == ((job, 3),)  # 9 tokens; a fourth input would make 12


def test_the_first_input_always_goes_in() -> None:
    job, _ = _job(20, 1)
    assert next_batch([job], max_inputs=4, max_tokens=10).parts == ((job, 1),)


def test_the_job_with_least_evaluated_goes_first() -> None:
    long, _ = _job(*[2] * 10)
    long.vectors = [np.zeros(2, np.float32)] * 2
    long.tokens_done = 4
    short, _ = _job(2, 2)
    batch = next_batch([long, short], max_inputs=3, max_tokens=100)
    assert batch.parts == ((short, 2), (long, 1))
    assert batch.inputs() == [[1, 1], [2, 2], [3, 3]]  # long's third input is next


def test_a_long_request_is_evaluated_one_batch_per_step() -> None:
    backend = Backend(max_sequences=4)
    queue, published = _queue(backend, batch_tokens=16)
    job, sink = _job(*[8] * 10)  # 80 tokens: two inputs per batch (16 tokens)
    queue.add(job)
    steps = 0
    while queue.step():
        steps += 1
        assert sink.ended is False  # answered only once all of it is evaluated
    assert steps + 1 == queue.evaluations == len(backend.evaluated) == 5
    assert all(sum(map(len, batch)) <= 16 for batch in backend.evaluated)
    assert sink.ended is None
    assert published
    (embedded,) = sink.sent
    assert [int(vector[0]) for vector in embedded.vectors] == list(range(1, 11))  # in order
    assert embedded.tokens == [8] * 10


def test_the_batch_is_never_narrower_than_the_window() -> None:
    backend = Backend()
    queue, _ = _queue(backend, batch_tokens=1)
    job, sink = _job(WINDOW, WINDOW)
    queue.add(job)
    while queue.step():
        pass
    assert [len(batch) for batch in backend.evaluated] == [1, 1]
    assert sink.ended is None


def test_a_short_request_arriving_meanwhile_is_in_the_next_batch() -> None:
    backend = Backend(max_sequences=2)
    queue, _ = _queue(backend, batch_tokens=100)
    long, long_sink = _job(*[4] * 20, first=1)
    queue.add(long)
    assert queue.step()
    short, short_sink = _job(4, first=50)
    queue.add(short)
    queue.step()
    assert backend.evaluated[1][0] == [50] * 4  # the short one first, then the long one's
    assert short_sink.ended is None
    assert len(short_sink.sent) == 1
    assert long_sink.ended is False  # 17 of its inputs still to come
    while queue.step():
        pass
    assert len(long_sink.sent[0].vectors) == 20


def test_a_request_whose_client_left_stops_between_batches() -> None:
    backend = Backend(max_sequences=2)
    queue, _ = _queue(backend)
    job, sink = _job(*[4] * 20)
    other, other_sink = _job(4, 4, first=70)
    queue.add(job)
    assert queue.step()
    sink.cancelled.set()
    queue.add(other)
    assert not queue.step()
    assert len(backend.evaluated) == 2  # one batch of it, then the other request only
    assert backend.evaluated[1] == [[70] * 4, [71] * 4]
    assert (sink.ended, sink.sent) == (None, [])  # ended with nothing: nobody listens
    assert other_sink.ended is None
    assert len(other_sink.sent) == 1


def test_a_library_failure_ends_every_waiting_request() -> None:
    backend = Backend(max_sequences=2)
    failures: list[str] = []
    queue = EmbedQueue(backend, failures.append, lambda: None, 100)
    first, first_sink = _job(4, 4, 4)
    second, second_sink = _job(4)
    queue.add(first)
    queue.add(second)
    backend.fail = True
    assert not queue.step()
    assert isinstance(first_sink.ended, BackendFailure)
    assert isinstance(second_sink.ended, BackendFailure)
    assert len(failures) == 1
    assert queue.waiting == 0


def test_abort_ends_the_waiting_requests_unavailable() -> None:
    queue, _ = _queue(Backend())
    job, sink = _job(4, 4, 4, 4, 4)
    queue.add(job)
    queue.step()
    queue.abort("model unloaded")
    assert isinstance(sink.ended, Unavailable)
    assert queue.waiting == 0


def test_each_batch_is_progress_the_watchdog_sees() -> None:
    """The worker thread steps the queue as its background work: every batch advances
    `progress`, which the engine's heartbeat carries. Each batch here takes a tenth of
    the stall limit, the whole request several times it: the watchdog never fires."""
    backend = Backend(max_sequences=1)
    slow_embed = backend.embed

    def embed(inputs: Sequence[Sequence[int]]) -> list[Vector]:
        threading.Event().wait(0.02 * len(inputs))  # in proportion to the work
        return slow_embed(inputs)

    backend.embed = embed  # type: ignore[method-assign]
    worker = ModelWorker("fake")
    queue, _ = _queue(backend)
    worker.attach(queue.step)
    limits = Liveness(hang_seconds=30, stall_seconds=0.2)
    clock = [0.0]
    pulse = Pulse(clock[0])
    job, sink = _job(*[4] * 40)  # 40 batches of 0.02 s: 0.8 s, four times the limit
    try:
        worker.submit(lambda: queue.add(job))
        progress_seen = 0
        while sink.ended is False:
            threading.Event().wait(0.01)
            clock[0] += 0.01
            progress = worker.progress
            pulse.heard(clock[0], progress)
            progress_seen = max(progress_seen, progress)
            assert pulse.verdict(clock[0], True, limits) is None
        assert eventually(lambda: len(sink.sent) == 1)
        assert progress_seen >= 20
    finally:
        worker.shutdown()
