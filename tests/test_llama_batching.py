"""The llama.cpp backend's batched decoding, and the low-level names it relies on."""

from __future__ import annotations

import threading
import tomllib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import llama_cpp
import pytest

from service.backends.base import ActiveSequence, Sampled, SequenceRequest
from service.backends.llama_cpp import backend as backend_module
from service.backends.llama_cpp.backend import LlamaCppBackend, LlamaCppOptions, LlamaSequence
from service.backends.llama_cpp.log import captured_native_log
from service.decode.scheduler import DecodeScheduler
from service.decode.sequence import DecodeEvent, DecodePlan
from service.decode.sink import Cancellation
from service.errors import InvalidRequest
from service.models.embedded import EMBEDDED_MODELS
from service.text.requests import Delta, Finished, FinishReason, Grammar, SamplingParams
from tests.conftest import SMOLLM

# Every low-level name the backend calls; they move between releases.
LOW_LEVEL_NAMES = (
    "llama_batch_init",
    "llama_batch_free",
    "llama_decode",
    "llama_get_memory",
    "llama_memory_seq_rm",
    "llama_memory_seq_cp",
    "llama_n_seq_max",
    "llama_n_batch",
    "llama_get_logits_ith",
    "llama_sampler_chain_init",
    "llama_sampler_chain_default_params",
    "llama_sampler_chain_add",
    "llama_sampler_init_greedy",
    "llama_sampler_init_dist",
    "llama_sampler_init_top_k",
    "llama_sampler_init_top_p",
    "llama_sampler_init_min_p",
    "llama_sampler_init_temp",
    "llama_sampler_init_penalties",
    "llama_sampler_init_grammar",
    "llama_sampler_accept",
    "llama_sampler_sample",
    "llama_sampler_free",
    "llama_vocab_n_tokens",
    "llama_token_to_piece",
    "LLAMA_FLASH_ATTN_TYPE_AUTO",
    "llama_supports_gpu_offload",
)

GREEDY = SamplingParams(temperature=0.0, top_p=1.0, top_k=0, min_p=0.0, repeat_penalty=1.0, seed=1)


def test_the_installed_binding_is_the_pinned_one() -> None:
    pyproject = tomllib.loads(Path("pyproject.toml").read_text())
    pins = [d for d in pyproject["project"]["dependencies"] if d.startswith("llama-cpp-python")]
    assert pins == [f"llama-cpp-python=={llama_cpp.__version__}"]


@pytest.mark.parametrize("name", LOW_LEVEL_NAMES)
def test_the_low_level_names_exist(name: str) -> None:
    assert hasattr(llama_cpp, name)


def test_the_context_parameters_we_set_exist() -> None:
    params = llama_cpp.llama_context_default_params()
    for field in ("n_seq_max", "kv_unified", "swa_full", "flash_attn_type", "n_ubatch"):
        assert hasattr(params, field)


@pytest.fixture(scope="module")
def backend() -> Iterator[LlamaCppBackend]:
    path = EMBEDDED_MODELS[SMOLLM].locate()
    options = LlamaCppOptions(context_size=512, threads=1, max_sequences=3, cached_sequences=1)
    loaded = LlamaCppBackend(path, options)
    yield loaded
    loaded.close()


def run(
    backend: LlamaCppBackend, prompts: list[str], tokens: int, **fields: object
) -> list[list[int]]:
    """Decode the prompts together for `tokens` tokens each; their sampled ids."""
    sequences: list[LlamaSequence] = []
    for prompt in prompts:
        prompt_ids = tuple(backend.tokenize(prompt, add_bos=backend.adds_bos))
        request = SequenceRequest(prompt_ids, GREEDY, tokens, **fields)  # type: ignore[arg-type]
        started = backend.start(request)
        assert started is not None
        sequences.append(started)
    produced: list[list[int]] = [[] for _ in prompts]
    try:
        while min(len(ids) for ids in produced) < tokens:
            for into, sampled in zip(produced, backend.step(sequences, lambda: None), strict=True):
                if sampled is not None:
                    into.append(sampled.token)
    finally:
        for sequence in sequences:
            backend.finish(sequence)
    return [ids[:tokens] for ids in produced]


def test_a_step_holds_512_tokens_on_the_cpu_and_1024_on_a_gpu_unless_configured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a GPU, long prompts arriving beside dozens of decoding streams need the wider
    step (see GPU_BATCH_SIZE); what the operator sets wins either way. Tried on the CPU
    by having the backend believe its layers compute on a GPU: llama.cpp's context
    gets the size it was asked for."""
    path = EMBEDDED_MODELS[SMOLLM].locate()
    options = LlamaCppOptions(context_size=1024, threads=1, max_sequences=1, cached_sequences=0)

    def step_sizes(opts: LlamaCppOptions) -> tuple[int, int, int, int]:
        loaded = LlamaCppBackend(path, opts)
        try:
            ctx = loaded._context.ctx
            batch = loaded._batch.capacity
            return (
                llama_cpp.llama_n_batch(ctx),
                llama_cpp.llama_n_ubatch(ctx),
                batch,
                loaded._prefill_chunk,
            )
        finally:
            loaded.close()

    assert step_sizes(options) == (512, 512, 512, backend_module.CPU_PREFILL_CHUNK)
    assert step_sizes(replace(options, batch_size=256))[:3] == (256, 256, 256)
    monkeypatch.setattr(backend_module, "_computes_off_cpu", lambda options: True)
    assert step_sizes(options) == (1024, 1024, 1024, 1024)
    assert step_sizes(replace(options, batch_size=256)) == (256, 256, 256, 256)


def test_sequences_in_one_batch_start_as_they_would_alone(backend: LlamaCppBackend) -> None:
    prompts = ["The sky is", "My favourite food is", "Water boils at"]
    alone = [run(backend, [prompt], 6)[0] for prompt in prompts]
    together = run(backend, prompts, 6)
    for lone, batched in zip(alone, together, strict=True):
        assert batched[:3] == lone[:3]
    assert len({tuple(ids[:3]) for ids in together}) == 3


def test_identical_prompts_in_one_batch_give_identical_tokens(backend: LlamaCppBackend) -> None:
    first, second, third = run(backend, ["Once upon a time"] * 3, 16)
    assert first == second == third


def test_a_grammar_constrains_each_sequence_on_its_own(backend: LlamaCppBackend) -> None:
    constrained, free = (
        run(backend, ["Answer:", "Answer:"], 3, grammar=Grammar('root ::= "yes" | "no"'))[0],
        run(backend, ["Answer:"], 3)[0],
    )
    text = b"".join(backend.token_bytes(t) for t in constrained).decode()
    assert text.startswith(("yes", "no"))
    assert free != constrained


def test_logprobs_are_bounded_and_ranked(backend: LlamaCppBackend) -> None:
    ids = tuple(backend.tokenize("The sky is", add_bos=backend.adds_bos))
    sequence = backend.start(SequenceRequest(ids, GREEDY, 2, top_logprobs=5))
    assert sequence is not None
    sampled = None
    while sampled is None:
        sampled = backend.step([sequence], lambda: None)[0]
    backend.finish(sequence)
    entry = sampled.logprob
    assert entry is not None
    assert entry.token_id == sampled.token
    assert entry.logprob <= 0
    assert [top.logprob for top in entry.top_logprobs] == sorted(
        (top.logprob for top in entry.top_logprobs), reverse=True
    )
    assert entry.top_logprobs[0].token_id == sampled.token  # greedy took the likeliest
    assert 0 < sum(2.718281828**top.logprob for top in entry.top_logprobs) <= 1.0001


@pytest.mark.parametrize("grammar", ["root ::= <no-such-token>", "root ::= <[999999999]>"])
def test_a_grammar_naming_tokens_the_vocabulary_lacks_is_refused(
    backend: LlamaCppBackend, grammar: str
) -> None:
    # The second one, let through, would abort the whole process at sampling time.
    ids = tuple(backend.tokenize("Hi", add_bos=False))
    with pytest.raises(InvalidRequest, match="vocabulary"):
        backend.start(SequenceRequest(ids, GREEDY, 2, grammar=Grammar(grammar)))
    # The refusal left nothing behind: the model still serves every place.
    assert len(run(backend, ["a", "b", "c"], 2)) == 3


def generate_ids(
    backend: LlamaCppBackend, prompt: tuple[int, ...], tokens: int
) -> tuple[list[int], int]:
    """Greedy tokens after `prompt`, alone, and how many prompt tokens came from the cache."""
    sequence = backend.start(SequenceRequest(prompt, GREEDY, tokens))
    assert isinstance(sequence, LlamaSequence)
    produced: list[int] = []
    while len(produced) < tokens:
        sampled = backend.step([sequence], lambda: None)[0]
        if sampled is not None:
            produced.append(sampled.token)
    backend.finish(sequence)
    return produced, sequence.cached_prompt_tokens


def test_a_parked_conversation_continues_from_host_memory(backend: LlamaCppBackend) -> None:
    path = EMBEDDED_MODELS[SMOLLM].locate()
    options = LlamaCppOptions(context_size=512, threads=1, max_sequences=1, cached_sequences=3)
    parking = LlamaCppBackend(path, options)
    try:
        first = tuple(parking.tokenize("The three primary colours are", add_bos=parking.adds_bos))
        answer, _ = generate_ids(parking, first, 6)
        generate_ids(parking, tuple(parking.tokenize("Unrelated: dogs", add_bos=False)), 4)
        assert parking._slots.slots[0].parked or any(s.parked for s in parking._slots.slots)
        follow_up = (*first, *answer, *parking.tokenize(" and", add_bos=False))
        continued, cached = generate_ids(parking, follow_up, 6)
    finally:
        parking.close()
    assert cached == len(first) + len(answer) - 1  # all but the last token it evaluated
    cold, _ = generate_ids(backend, follow_up, 6)
    assert continued[:3] == cold[:3]


def per_sequence_backend() -> LlamaCppBackend:
    path = EMBEDDED_MODELS[SMOLLM].locate()
    options = LlamaCppOptions(
        context_size=256, threads=1, max_sequences=3, cached_sequences=2, kv_layout="per-sequence"
    )
    return LlamaCppBackend(path, options)


@pytest.fixture
def per_sequence() -> Iterator[LlamaCppBackend]:
    loaded = per_sequence_backend()
    yield loaded
    loaded.close()


def test_a_per_sequence_cache_gives_each_sequence_its_own_window(
    per_sequence: LlamaCppBackend,
) -> None:
    assert per_sequence.context_length == 256
    assert llama_cpp.llama_n_ctx(per_sequence._context.ctx) == 256 * 5


def test_a_unified_pool_exceeds_the_trained_window_while_each_sequence_stays_within_it() -> None:
    path = EMBEDDED_MODELS[SMOLLM].locate()
    trained = 8192  # SmolLM2-135M's n_ctx_train
    options = LlamaCppOptions(
        context_size=trained + 4096, threads=1, max_sequences=1, cached_sequences=1
    )
    with captured_native_log() as said:
        pooled = LlamaCppBackend(path, options)
    try:
        assert llama_cpp.llama_n_ctx(pooled._context.ctx) == trained + 4096
        assert pooled.context_length == trained
        assert not [line for line in said if "overflow" in line]
    finally:
        pooled.close()
    wide = LlamaCppBackend(path, replace(options, kv_layout="per-sequence"))
    try:
        assert wide.context_length == trained
        assert llama_cpp.llama_n_ctx(wide._context.ctx) == trained * 2
    finally:
        wide.close()


def test_per_sequence_caches_decode_as_the_unified_one_does(
    backend: LlamaCppBackend, per_sequence: LlamaCppBackend
) -> None:
    prompts = ["The sky is", "My favourite food is", "Water boils at"]
    unified = run(backend, prompts, 6)
    for ours, theirs in zip(run(per_sequence, prompts, 6), unified, strict=True):
        assert ours[:3] == theirs[:3]


def test_a_conversation_moves_between_per_sequence_caches_and_keeps_its_cells(
    backend: LlamaCppBackend, per_sequence: LlamaCppBackend
) -> None:
    first = tuple(per_sequence.tokenize("The three primary colours are", add_bos=True))
    answer, _ = generate_ids(per_sequence, first, 6)
    slots = per_sequence._slots.slots
    # It finished in the lowest slot and moved to the highest.
    assert not slots[0].tokens
    assert slots[-1].tokens == [*first, *answer[:-1]]
    follow_up = (*first, *answer, *per_sequence.tokenize(" and", add_bos=False))
    continued, cached = generate_ids(per_sequence, follow_up, 6)
    assert cached == len(first) + len(answer) - 1
    cold, _ = generate_ids(backend, follow_up, 6)
    assert continued[:3] == cold[:3]


def test_a_shared_prefix_is_copied_between_per_sequence_caches(
    backend: LlamaCppBackend, per_sequence: LlamaCppBackend
) -> None:
    system = "You are a careful assistant who answers in one short sentence. " * 3
    shared = tuple(per_sequence.tokenize(system, add_bos=True))
    generate_ids(per_sequence, (*shared, *per_sequence.tokenize("Q: sky?", add_bos=False)), 2)
    branch = (*shared, *per_sequence.tokenize("Q: grass colour?", add_bos=False))
    produced, cached = generate_ids(per_sequence, branch, 6)
    assert cached >= len(shared)
    cold, _ = generate_ids(backend, branch, 6)
    assert produced[:3] == cold[:3]


def _schedule(backend: LlamaCppBackend, prompts: list[str]) -> list[_TextSink]:
    """The prompts decoded together through the scheduler to their ends."""
    sinks = [_TextSink() for _ in prompts]
    scheduler = DecodeScheduler(backend, max_waiting=8)
    for index, (prompt, sink) in enumerate(zip(prompts, sinks, strict=True)):
        prompt_ids = tuple(backend.tokenize(prompt, add_bos=backend.adds_bos))
        sequence = SequenceRequest(prompt_ids, GREEDY, max_tokens=6 + 5 * index)  # ends apart
        # and some may end at a stop sequence, found after the fact
        plan = DecodePlan(sequence, stop=(".",), time_limit_s=None)
        scheduler.enqueue(plan, 0.0, sink)
    while scheduler.step():
        pass
    return sinks


class _TextSink:
    def __init__(self) -> None:
        self.cancelled = Cancellation()
        self.ids: list[int] = []
        self.finished: Finished | None = None
        self.threads: set[str] = set()
        self.ended = False

    def send(self, item: DecodeEvent) -> None:
        self.threads.add(threading.current_thread().name)
        if isinstance(item, Delta):
            self.ids.extend(item.token_ids)
        else:
            self.finished = item

    def close(self, error: BaseException | None = None) -> None:
        assert error is None
        self.ended = True


def test_the_work_beside_a_gpu_forward_pass_keeps_every_stream_whole(
    backend: LlamaCppBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a GPU the scheduler hands out a step's tokens during the next forward pass,
    on another thread. Tried here on the CPU by having the backend say it computes
    off it: each stream ends as it should (length, or its stop sequence), with the
    tokens of the plain order (a batch of another shape may part from them at a
    near-tie, so the first ones are compared), and every sequence is released."""
    prompts = ["The sky is", "My favourite food is", "Water boils at", "Paris is"]
    plain = _schedule(backend, prompts)
    monkeypatch.setattr(LlamaCppBackend, "computes_off_cpu", property(lambda self: True))
    beside = _schedule(backend, prompts)
    for index, (one, other) in enumerate(zip(plain, beside, strict=True)):
        assert other.ended
        assert other.finished is not None
        assert one.finished is not None
        assert other.ids[:4] == one.ids[:4]
        if other.finished.finish_reason is FinishReason.LENGTH:
            assert other.finished.usage.completion_tokens == 6 + 5 * index
        else:
            assert other.finished.finish_reason is FinishReason.STOP_SEQUENCE
        assert any(name.startswith("beside-forward") for name in other.threads)
    assert not any("beside-forward" in name for sink in plain for name in sink.threads)
    # Nothing is left running: the backend takes max_sequences new ones at once.
    assert all(len(ids) for ids in run(backend, ["a", "b", "c"], 2))


class _LateDraws:
    """The backend's own draws (see own_draws) with their timing scripted, the way a
    loaded machine times them: every other draw outlasts the step that started it and
    shows as done from the next step on; the others are done before their step ends.
    Each draw runs at once, where it starts: only when it shows as done is scripted,
    so that the race goes the same way on every run."""

    def __init__(self) -> None:
        self.steps = 0  # counted by `_window_filler`'s backend
        self._draws = 0
        # Each draw, and the step from which it shows as done.
        self._running: dict[LlamaSequence, tuple[Sampled, int]] = {}

    def running(self, sequence: LlamaSequence) -> bool:
        return sequence in self._running

    def start(self, sequence: LlamaSequence, draw: Callable[[], Sampled]) -> None:
        self._draws += 1
        late = self._draws % 2
        self._running[sequence] = (draw(), self.steps + late)

    def wait(self, sequences: Iterable[LlamaSequence], seconds: float) -> None:
        pass  # the script says when a draw is done

    def wait_for_any(self, sequences: Iterable[LlamaSequence]) -> None:
        for sequence in sequences:
            if sequence in self._running:
                self._running[sequence] = (self._running[sequence][0], self.steps)

    def collect(self, sequences: Iterable[LlamaSequence]) -> dict[LlamaSequence, Sampled]:
        done = [s for s in sequences if s in self._running and self._running[s][1] <= self.steps]
        return {sequence: self._running.pop(sequence)[0] for sequence in done}

    def settle(self, sequence: LlamaSequence) -> None:
        self._running.pop(sequence, None)

    def close(self) -> None:
        self._running.clear()


def _window_filler(tiny_model: Path) -> tuple[LlamaCppBackend, SequenceRequest]:
    """A per-sequence tiny backend whose own draws come late every other time, and a
    request (a sampler of its own: a logit bias that keeps the ends away) that fills
    its sequence's window to the last cell."""
    options = LlamaCppOptions(
        context_size=256, threads=1, max_sequences=2, cached_sequences=1, kv_layout="per-sequence"
    )
    backend = LlamaCppBackend(tiny_model, options)
    draws = backend._own_draws = _LateDraws()  # type: ignore[assignment]
    step = backend.step

    def counted_step(
        sequences: Sequence[ActiveSequence], before_compute: Callable[[], None]
    ) -> list[Sampled | None]:
        draws.steps += 1
        return step(sequences, before_compute)

    backend.step = counted_step  # type: ignore[method-assign]
    prompt = tuple(backend.tokenize(" ".join(f"item {i}," for i in range(10)), add_bos=True))
    ends = tuple((t, -100.0) for t in range(backend.vocab_size) if backend.is_end_of_generation(t))
    sampling = replace(GREEDY, logit_bias=ends)
    return backend, SequenceRequest(prompt, sampling, backend.context_length - len(prompt))


def test_a_late_draw_loses_no_token_and_the_window_fills_to_its_last_cell(
    tiny_model: Path,
) -> None:
    """Issue 46: a draw taken up at the start of a step (and evaluated in it) had its
    token replaced by the draw that step started, when that one was done in time: the
    cache held a token the caller never saw, and a sequence filling its window ran out
    of cells short of max_tokens (llama_decode failed; the model was discarded)."""
    backend, request = _window_filler(tiny_model)
    window = backend.context_length
    try:
        sequence = backend.start(request)
        assert sequence is not None
        produced: list[int] = []
        for _ in range(3 * request.max_tokens):  # a bound: a sequence may sit steps out
            sampled = backend.step([sequence], lambda: None)[0]
            if sampled is not None:
                produced.append(sampled.token)
            if len(produced) == request.max_tokens:
                break
        evaluated = sequence.slot.tokens[len(request.prompt_ids) :]
        backend.finish(sequence)
    finally:
        backend.close()
    assert len(produced) == request.max_tokens
    # Every token evaluated was handed out, in order, and none more than the window holds.
    assert evaluated == produced[: len(evaluated)]
    assert len(request.prompt_ids) + len(evaluated) <= window


class _EndingSink(_TextSink):
    def __init__(self) -> None:
        super().__init__()
        self.error: BaseException | None = None

    def close(self, error: BaseException | None = None) -> None:
        self.error = error
        self.ended = True


def test_a_stream_handed_out_beside_the_forward_pass_fills_the_window_to_its_last_cell(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a GPU the scheduler learns that a request is done during the next step, so
    the backend is stepped once more; a late draw's token is evaluated in the step that
    returns it, so that extra step's token would need a cell past the window (tried on
    the CPU by having the backend say it computes off it)."""
    monkeypatch.setattr(LlamaCppBackend, "computes_off_cpu", property(lambda self: True))
    backend, request = _window_filler(tiny_model)
    sink = _EndingSink()
    failures: list[str] = []
    try:
        scheduler = DecodeScheduler(backend, max_waiting=1, on_failure=failures.append)
        scheduler.enqueue(DecodePlan(request, stop=(), time_limit_s=None), 0.0, sink)
        while scheduler.step():
            pass
    finally:
        backend.close()
    # The stream may end whole before the step that fails the model does.
    assert not failures
    assert sink.error is None
    assert sink.finished is not None
    assert sink.finished.usage.completion_tokens == request.max_tokens


def _chunked_backend() -> LlamaCppBackend:
    """SmolLM2 reading prompts 64 tokens a step."""
    path = EMBEDDED_MODELS[SMOLLM].locate()
    options = LlamaCppOptions(context_size=512, threads=1, max_sequences=1, batch_size=64)
    return LlamaCppBackend(path, options)


def test_an_interrupted_step_evaluates_nothing_and_the_sequence_goes_on_as_before() -> None:
    interrupted, plain = _chunked_backend(), _chunked_backend()
    try:
        text = "A lighthouse keeper wrote down the weather every morning. " * 16
        prompt = tuple(interrupted.tokenize(text, add_bos=interrupted.adds_bos))
        assert len(prompt) > 2 * 64
        sequence = interrupted.start(SequenceRequest(prompt, GREEDY, 6))
        assert isinstance(sequence, LlamaSequence)
        assert interrupted.step([sequence], lambda: None) == [None]  # the first 64
        memory = llama_cpp.llama_get_memory(interrupted._context.ctx)
        interrupted.interrupt_step(True)
        assert interrupted.step([sequence], lambda: None) == [None]
        # The cache holds the first step's cells, none of the interrupted one's.
        assert llama_cpp.llama_memory_seq_pos_max(memory, sequence.slot.seq_id) == 63
        assert len(sequence.slot.tokens) == 64
        interrupted.interrupt_step(False)
        produced: list[int] = []
        while len(produced) < 6:
            sampled = interrupted.step([sequence], lambda: None)[0]
            if sampled is not None:
                produced.append(sampled.token)
        interrupted.finish(sequence)
        expected, _ = generate_ids(plain, prompt, 6)
    finally:
        interrupted.close()
        plain.close()
    assert produced == expected


def test_an_interrupted_step_over_per_sequence_caches_leaves_each_sequence_as_it_was() -> None:
    """With a cache per sequence each sequence's tokens are a forward pass of their own
    within the step; an interrupt leaves every one of them where the last step did."""
    prompts = ["The sky is", "My favourite food is"]
    interrupted, plain = per_sequence_backend(), per_sequence_backend()
    try:
        expected = run(plain, prompts, 6)
        sequences = []
        for prompt in prompts:
            ids = tuple(interrupted.tokenize(prompt, add_bos=interrupted.adds_bos))
            started = interrupted.start(SequenceRequest(ids, GREEDY, 6))
            assert isinstance(started, LlamaSequence)
            sequences.append(started)
        produced: list[list[int]] = [[], []]

        def step() -> list[Sampled | None]:
            return interrupted.step(sequences, lambda: None)

        while min(len(ids) for ids in produced) < 2:
            for into, sampled in zip(produced, step(), strict=True):
                if sampled is not None:
                    into.append(sampled.token)
        held = [list(sequence.slot.tokens) for sequence in sequences]
        interrupted.interrupt_step(True)
        assert step() == [None, None]
        memory = llama_cpp.llama_get_memory(interrupted._context.ctx)
        for sequence, tokens in zip(sequences, held, strict=True):
            assert sequence.slot.tokens == tokens
            last = llama_cpp.llama_memory_seq_pos_max(memory, sequence.slot.seq_id)
            assert last == len(tokens) - 1
        interrupted.interrupt_step(False)
        while min(len(ids) for ids in produced) < 6:
            for into, sampled in zip(produced, step(), strict=True):
                if sampled is not None:
                    into.append(sampled.token)
        for sequence in sequences:
            interrupted.finish(sequence)
    finally:
        interrupted.close()
        plain.close()
    assert [ids[:6] for ids in produced] == expected
