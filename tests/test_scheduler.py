"""The decode scheduler driven over a backend with no model (issue 28).

`StepBackend` does what the llama.cpp backend does around the forward pass: it
keeps each sequence's pending tokens, asks the real step planner
(`service.backends.step_plan`) what each one evaluates, and records every step.
Its "model" answers token 1 forever, so a request runs until its max_tokens.
The tests check the scheduler and the planner together: a step never holds more
than the budget, streams keep advancing while a long prompt goes in by chunks,
a long prompt is not starved, a request cancelled mid-prompt frees its place, and
a step whose every request is cancelled while it computes is interrupted.
Each runs twice: as on a CPU, and as on a GPU, where the backend runs the
scheduler's work between steps on another thread during its forward pass, and
no sequence may be released while that pass computes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pytest

from service.backends.base import ActiveSequence, Sampled, SequenceRequest
from service.backends.step_plan import Seat, plan_step
from service.decode.scheduler import DecodeScheduler
from service.decode.sequence import DecodeEvent, DecodePlan
from service.decode.sink import Cancellation
from service.text.plain_content import ControlTexts
from service.text.requests import Delta, Finished, SamplingDefaults, SamplingParams

CAPACITY, CHUNK, TOKEN = 64, 16, 1
GREEDY = SamplingParams(temperature=0.0, top_p=1.0, top_k=0, min_p=0.0, repeat_penalty=1.0, seed=0)


@dataclass(eq=False)
class FakeSequence:
    name: str
    pending: int
    cached_prompt_tokens: int = 0
    decoding: bool = False


@dataclass
class StepBackend:
    """A batching backend without a model: the planner's decisions, recorded."""

    max_sequences: int
    names: dict[int, str] = field(default_factory=dict)  # first prompt token -> name
    steps: list[dict[str, int]] = field(default_factory=list)  # tokens per name, per step
    finished: list[str] = field(default_factory=list)
    running: list[FakeSequence] = field(default_factory=list)
    computing: bool = False
    released_while_computing: int = 0
    computes_off_cpu: bool = False
    # Runs once, in the next step's "forward pass" (cancels that come meanwhile).
    mid_pass: Callable[[], None] | None = None
    interrupted: bool = False  # what the scheduler asks now (interrupt_step)
    # Tokens a decode step gives each sequence, as a step that verified drafts would.
    run_length: int = 1
    interrupted_steps: int = 0
    name: str = "fake"
    context_length: int = 100_000
    adds_bos: bool = False
    chat_template: str | None = None
    template_tokens: dict[str, str] = field(default_factory=dict)

    def start(self, request: SequenceRequest) -> ActiveSequence | None:
        if len(self.running) >= self.max_sequences:
            return None
        sequence = FakeSequence(self.names[request.prompt_ids[0]], len(request.prompt_ids))
        self.running.append(sequence)
        return sequence

    def step(
        self, sequences: Sequence[ActiveSequence], before_compute: Callable[[], None]
    ) -> list[Sampled | None]:
        own = [s for s in sequences if isinstance(s, FakeSequence)]
        takes = plan_step([Seat(s.pending, s.decoding) for s in own], CAPACITY, CHUNK)
        self._compute_beside(before_compute)
        mid_pass, self.mid_pass = self.mid_pass, None
        if mid_pass is not None:
            mid_pass()
        if self.interrupted:  # as llama.cpp's: nothing evaluated, nothing sampled
            self.interrupted_steps += 1
            return [None] * len(own)
        self.steps.append({s.name: take for s, take in zip(own, takes, strict=True) if take})
        sampled: list[Sampled | None] = []
        for sequence, take in zip(own, takes, strict=True):
            sequence.pending -= take
            done = take and sequence.pending == 0
            if done:  # the last prompt chunk or a decode token: a token comes out
                sequence.decoding, sequence.pending = True, 1
            more = tuple(Sampled(TOKEN) for _ in range(self.run_length - 1))
            sampled.append(Sampled(TOKEN, more=more if take == 1 else ()) if done else None)
        return sampled

    def _compute_beside(self, before_compute: Callable[[], None]) -> None:
        if not self.computes_off_cpu:
            before_compute()
            return
        self.computing = True  # the "forward pass", with the work on a thread beside it
        beside = threading.Thread(target=before_compute)
        beside.start()
        beside.join()
        self.computing = False

    def finish(self, sequence: ActiveSequence) -> None:
        assert isinstance(sequence, FakeSequence)
        self.released_while_computing += self.computing
        self.running.remove(sequence)
        self.finished.append(sequence.name)

    def interrupt_step(self, interrupted: bool) -> None:
        self.interrupted = interrupted

    def is_end_of_generation(self, token_id: int) -> bool:
        return False

    def sampling_defaults(self) -> SamplingDefaults:
        return SamplingDefaults()

    def tokenize(self, text: str, *, add_bos: bool, special: bool = True) -> list[int]:
        return [TOKEN] * len(text)

    def control_texts(self) -> ControlTexts:
        return ControlTexts([])

    def token_bytes(self, token_id: int) -> bytes:
        return b"x"

    @property
    def vocab_size(self) -> int:
        return TOKEN + 1

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return "x" * len(token_ids)

    def close(self) -> None:
        pass


class Sink:
    """Collects one request's events, as the engine's frame sink would."""

    def __init__(self) -> None:
        self.cancelled = Cancellation()
        self.events: list[DecodeEvent] = []
        self.closed: BaseException | bool | None = False

    def send(self, item: DecodeEvent) -> None:
        self.events.append(item)

    def close(self, error: BaseException | None = None) -> None:
        self.closed = error if error is not None else True

    @property
    def tokens(self) -> int:
        return sum(len(e.token_ids) for e in self.events if isinstance(e, Delta))

    @property
    def finished(self) -> bool:
        return any(isinstance(e, Finished) for e in self.events)


class Harness:
    def __init__(self, max_sequences: int, overlap: bool) -> None:
        self.backend = StepBackend(max_sequences, computes_off_cpu=overlap)
        self.scheduler = DecodeScheduler(self.backend, max_waiting=64)
        self.sinks: dict[str, Sink] = {}

    def submit(self, name: str, prompt: int, answer: int) -> Sink:
        marker = 1000 + len(self.sinks)  # the prompt's first token names it
        self.backend.names[marker] = name
        prompt_ids = (marker,) + (TOKEN,) * (prompt - 1)
        plan = DecodePlan(SequenceRequest(prompt_ids, GREEDY, answer), (), time_limit_s=None)
        sink = self.sinks[name] = Sink()
        self.scheduler.enqueue(plan, 0.0, sink)
        return sink

    def run(self, steps: int) -> None:
        for _ in range(steps):
            if not self.scheduler.step():
                break
        assert self.backend.released_while_computing == 0


@pytest.fixture(params=[False, True], ids=["cpu", "overlapped"])
def overlap(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


def test_no_step_holds_more_than_the_budget(overlap: bool) -> None:
    harness = Harness(max_sequences=8, overlap=overlap)
    for index in range(8):
        harness.submit(f"r{index}", prompt=50 + 7 * index, answer=20)
    harness.run(500)
    assert all(sink.finished and sink.tokens == 20 for sink in harness.sinks.values())
    assert max(sum(step.values()) for step in harness.backend.steps) <= CAPACITY
    # Prompts were split: no one step took a whole 50+ token prompt beside decoders.
    assert any(0 < step.get("r7", 0) < 99 for step in harness.backend.steps)


def test_streams_advance_every_step_while_a_long_prompt_goes_in_by_chunks(overlap: bool) -> None:
    harness = Harness(max_sequences=4, overlap=overlap)
    streams = [harness.submit(f"s{index}", prompt=8, answer=200) for index in range(3)]
    harness.run(3)  # the streams are decoding
    harness.submit("long", prompt=40 * CHUNK, answer=2)
    harness.run(60)
    chunked = [step for step in harness.backend.steps if "long" in step]
    assert len(chunked) >= 40  # at most CHUNK prompt tokens a step beside the streams
    assert all(step["long"] <= CHUNK for step in chunked)
    # Every one of those steps also gave each stream its token.
    assert all(all(step.get(f"s{i}") == 1 for i in range(3)) for step in chunked)
    assert harness.sinks["long"].finished
    assert all(not stream.finished for stream in streams)  # still going


def test_a_long_prompt_is_not_starved_by_newer_short_ones(overlap: bool) -> None:
    harness = Harness(max_sequences=4, overlap=overlap)
    harness.submit("streaming", prompt=4, answer=10_000)
    harness.run(2)
    harness.submit("long", prompt=10 * CHUNK, answer=1)
    first_token_step: dict[str, int] = {}
    for step in range(200):
        harness.submit(f"short{step}", prompt=CHUNK, answer=1)  # one more every step
        harness.run(1)
        for name, sink in harness.sinks.items():
            if sink.tokens and name not in first_token_step:
                first_token_step[name] = step
    assert "long" in first_token_step
    # It came before every short one, and every short one still waited its turn.
    shorts = [step for name, step in first_token_step.items() if name.startswith("short")]
    assert shorts
    assert min(shorts) >= first_token_step["long"]


def test_cancelling_mid_prompt_frees_the_place_for_the_next_request(overlap: bool) -> None:
    harness = Harness(max_sequences=1, overlap=overlap)
    long = harness.submit("long", prompt=50 * CHUNK, answer=5)
    waiting = harness.submit("next", prompt=10, answer=3)
    harness.run(3)
    assert [s.name for s in harness.backend.running] == ["long"]
    assert long.tokens == 0  # still reading its prompt
    long.cancelled.set()
    harness.run(20)
    assert harness.backend.finished[0] == "long"  # its sequence was released
    assert waiting.finished
    assert waiting.tokens == 3
    assert long.tokens == 0
    assert not long.finished
    assert harness.backend.running == []


def test_a_step_whose_every_request_is_cancelled_mid_pass_is_interrupted(overlap: bool) -> None:
    harness = Harness(max_sequences=2, overlap=overlap)
    cancelled = [harness.submit(f"long{i}", prompt=50 * CHUNK, answer=5) for i in range(2)]
    waiting = harness.submit("next", prompt=10, answer=3)
    harness.run(3)

    def cancel_both() -> None:
        for sink in cancelled:
            sink.cancelled.set()

    harness.backend.mid_pass = cancel_both
    harness.run(30)
    assert harness.backend.interrupted_steps == 1
    assert sorted(harness.backend.finished[:2]) == ["long0", "long1"]  # released
    # The request that waited for their places ran whole: the flag was cleared.
    assert waiting.finished
    assert waiting.tokens == 3
    assert not harness.backend.interrupted


def test_a_step_goes_on_while_one_of_its_requests_is_still_wanted(overlap: bool) -> None:
    harness = Harness(max_sequences=2, overlap=overlap)
    leaving = harness.submit("leaving", prompt=50 * CHUNK, answer=5)
    staying = harness.submit("staying", prompt=4 * CHUNK, answer=5)
    harness.run(2)
    harness.backend.mid_pass = leaving.cancelled.set
    harness.run(50)
    assert harness.backend.interrupted_steps == 0
    assert staying.finished
    assert staying.tokens == 5
    assert "leaving" in harness.backend.finished


def test_a_cancel_heard_once_a_step_ended_does_not_interrupt_the_next(overlap: bool) -> None:
    harness = Harness(max_sequences=2, overlap=overlap)
    first = harness.submit("first", prompt=4, answer=50)
    harness.run(2)
    first.cancelled.set()  # between steps: the next step drops it before it computes
    second = harness.submit("second", prompt=4, answer=3)
    harness.run(20)
    assert harness.backend.interrupted_steps == 0
    assert second.finished
    assert second.tokens == 3


def test_every_token_arrives_once_and_in_order_with_the_work_beside_the_step(
    overlap: bool,
) -> None:
    harness = Harness(max_sequences=4, overlap=overlap)
    sinks = [harness.submit(f"r{i}", prompt=5 + i, answer=7 + 3 * i) for i in range(6)]
    harness.run(200)
    for index, sink in enumerate(sinks):
        assert sink.closed is True  # ended cleanly
        assert sink.finished
        assert sink.tokens == 7 + 3 * index
    assert sorted(harness.backend.finished) == sorted(f"r{i}" for i in range(6))
    assert harness.backend.running == []


def test_a_step_s_run_of_verified_tokens_all_arrive_and_stop_at_max_tokens(
    overlap: bool,
) -> None:
    harness = Harness(max_sequences=4, overlap=overlap)
    harness.backend.run_length = 3
    sinks = [harness.submit(f"r{i}", prompt=5, answer=7 + i) for i in range(3)]
    harness.run(200)
    for index, sink in enumerate(sinks):
        finished = [e for e in sink.events if isinstance(e, Finished)]
        assert sink.tokens == 7 + index  # a run past max_tokens is cut where it ends
        assert finished[0].usage.completion_tokens == 7 + index
    # The first token comes from the prompt's step, then three a step.
    decode_steps = sum(1 for step in harness.backend.steps if step.get("r2") == 1)
    # 1 + 3 + 3 + 3 >= 9 tokens; handed out during the next pass, the end is seen a step late.
    assert decode_steps == (4 if overlap else 3)


def test_a_request_cancelled_while_waiting_is_ended_without_running(overlap: bool) -> None:
    harness = Harness(max_sequences=1, overlap=overlap)
    harness.submit("running", prompt=4, answer=50)
    waiting = harness.submit("waiting", prompt=4, answer=5)
    harness.run(2)
    waiting.cancelled.set()
    harness.run(100)
    assert waiting.closed is True  # its stream ended, so the engine lets go of it
    assert waiting.tokens == 0
    assert "waiting" not in harness.backend.finished  # it never got a sequence


class BrokenSink(Sink):
    """A sink whose sending fails, as a bug in one request's response code would."""

    def __init__(self, fails_on: type[DecodeEvent]) -> None:
        super().__init__()
        self.fails_on = fails_on

    def send(self, item: DecodeEvent) -> None:
        if isinstance(item, self.fails_on):
            raise TypeError("Object of type set is not JSON serializable")
        super().send(item)


@pytest.mark.parametrize("fails_on", [Delta, Finished], ids=["mid-stream", "at-its-end"])
def test_a_request_whose_events_cannot_be_sent_fails_alone(
    overlap: bool, fails_on: type[DecodeEvent]
) -> None:
    harness = Harness(max_sequences=4, overlap=overlap)
    others = [harness.submit(f"r{i}", prompt=6, answer=30) for i in range(2)]
    broken = BrokenSink(fails_on)
    plan = DecodePlan(SequenceRequest((2000,) + (TOKEN,) * 5, GREEDY, 3), (), time_limit_s=None)
    harness.backend.names[2000] = "broken"
    harness.scheduler.enqueue(plan, 0.0, broken)
    harness.run(200)
    assert isinstance(broken.closed, TypeError)  # its stream ended with the error
    assert "broken" in harness.backend.finished  # and its sequence was released
    for sink in others:
        assert sink.closed is True
        assert sink.tokens == 30
    assert harness.backend.running == []


def test_a_cancellation_tells_each_listener_once_on_the_thread_that_sets_it() -> None:
    cancellation = Cancellation()
    heard: list[str] = []
    cancellation.when_set(lambda: heard.append(threading.current_thread().name))
    setter = threading.Thread(target=cancellation.set, name="setter")
    setter.start()
    setter.join()
    cancellation.set()  # again: nobody is told twice
    cancellation.when_set(lambda: heard.append("late"))  # already set: told at once
    assert heard == ["setter", "late"]
    assert cancellation.is_set()
