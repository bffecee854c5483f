"""The batch step's plan, tested without a model (issue 28), as vLLM tests its scheduler.

`simulate` runs the planner over many steps the way the backend does: a seat's
prompt shrinks by what it took, and a seat whose prompt is done decodes one
token a step until its answer is complete.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from service.backends.step_plan import Seat, plan_step

CAPACITY, CHUNK = 512, 128


def test_every_decoding_sequence_gets_its_token_first() -> None:
    seats = [Seat(300, False), Seat(1, True), Seat(1, True)]
    assert plan_step(seats, CAPACITY, CHUNK) == [CHUNK, 1, 1]


def test_prompts_get_the_whole_batch_when_nothing_decodes() -> None:
    seats = [Seat(300, False), Seat(300, False)]
    assert plan_step(seats, CAPACITY, CHUNK) == [300, 212]  # in arrival order


def test_the_budget_is_respected_with_many_decoders() -> None:
    seats = [Seat(1, True)] * 500 + [Seat(400, False)]
    takes = plan_step(seats, CAPACITY, CHUNK)
    assert sum(takes) <= CAPACITY
    assert takes[-1] == 12  # what is left of the batch after 500 decode tokens


def test_a_drawing_sequence_sits_out() -> None:
    seats = [Seat(1, True, drawing=True), Seat(1, True), Seat(50, False)]
    assert plan_step(seats, CAPACITY, CHUNK) == [0, 1, 50]


@dataclass
class Sim:
    prompt: int
    answer: int
    arrived: int
    evaluated: int = 0
    generated: int = 0
    first_token_step: int | None = None
    steps_with_tokens: list[int] = field(default_factory=list)

    @property
    def decoding(self) -> bool:
        return self.evaluated >= self.prompt

    @property
    def done(self) -> bool:
        return self.generated >= self.answer


def simulate(sims: list[Sim], steps: int) -> None:
    for step in range(steps):
        active = [s for s in sims if s.arrived <= step and not s.done]
        seats = [Seat(1 if s.decoding else s.prompt - s.evaluated, s.decoding) for s in active]
        takes = plan_step(seats, CAPACITY, CHUNK)
        assert sum(takes) <= CAPACITY
        for sim, take in zip(active, takes, strict=True):
            if not take:
                continue
            if sim.decoding:
                sim.generated += 1
                sim.steps_with_tokens.append(step)
            else:
                sim.evaluated += take
                if sim.decoding:  # the last chunk's logits give the first token
                    sim.generated += 1
                    sim.first_token_step = step
                    sim.steps_with_tokens.append(step)


def test_decoding_streams_advance_every_step_while_a_long_prompt_is_chunked() -> None:
    streams = [Sim(prompt=20, answer=200, arrived=0) for _ in range(4)]
    long = Sim(prompt=5000, answer=5, arrived=5)
    simulate([*streams, long], steps=120)
    for stream in streams:  # one token every step from the first, through the long prompt
        first = stream.steps_with_tokens[0]
        assert stream.steps_with_tokens == list(range(first, first + len(stream.steps_with_tokens)))
    # The long prompt went in 128-token chunks and finished.
    assert long.first_token_step == 5 + 5000 // CHUNK
    assert long.done


def test_a_long_prompt_is_not_starved_by_newer_short_ones() -> None:
    long = Sim(prompt=2000, answer=1, arrived=0)
    decoder = Sim(prompt=1, answer=10_000, arrived=0)
    shorts = [Sim(prompt=100, answer=1, arrived=step) for step in range(1, 60)]
    simulate([decoder, long, *shorts], steps=200)
    assert long.first_token_step is not None
    # It arrived first, so it is served first: no newer prompt takes the room before it.
    assert all(
        s.first_token_step is None or s.first_token_step >= long.first_token_step for s in shorts
    )
