"""The mlx-lm backend on a tiny real checkpoint, driven through the shared decode loop."""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import pytest

from service.backends.base import SequenceRequest
from service.decode.scheduler import OneAtATime
from service.decode.sequence import DecodeEvent, DecodePlan, SequenceDecoder
from service.errors import BackendFailure, NotSupported
from service.text.chat_template import render_chat
from service.text.requests import (
    ChatMessage,
    Delta,
    Finished,
    FinishReason,
    SamplingDefaults,
    SamplingParams,
)
from tests.mlx_checkpoint import (
    BEGIN_OF_TEXT,
    IM_END,
    IM_START,
    MAX_POSITION_EMBEDDINGS,
    SLIDING_WINDOW,
    build_tiny_checkpoint,
)

if TYPE_CHECKING:  # mlx-lm imports transformers: seconds, so only in the tests that run it
    from service.backends.mlx_lm import MlxLmBackend

GENERATION_CONFIG = {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.1}
FOX = "The quick brown fox"
PARIS = "What is the capital of France?"
# Longer than the sliding window, so the rotating cache wraps during the prompt.
STORY = "Once upon a time there was a small language model that lived on a computer"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("mlx") / "tiny"
    return build_tiny_checkpoint(directory, generation_config=GENERATION_CONFIG)


@pytest.fixture(scope="module")
def backend(checkpoint: Path) -> Iterator[MlxLmBackend]:
    from service.backends.mlx_lm import MlxLmBackend, MlxLmOptions

    backend = MlxLmBackend(checkpoint, MlxLmOptions(context_size=4096))
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def reference(checkpoint: Path) -> Any:
    """The same checkpoint loaded by mlx-lm alone: the model's own answers."""
    from mlx_lm.utils import load

    return load(str(checkpoint))[0]


def params(
    temperature: float = 0.0, seed: int = 0, repeat_penalty: float = 1.0, **penalties: Any
) -> SamplingParams:
    return SamplingParams(
        temperature=temperature,
        top_p=1.0,
        top_k=0,
        min_p=0.0,
        repeat_penalty=repeat_penalty,
        seed=seed,
        **penalties,
    )


@dataclass(frozen=True)
class Run:
    token_ids: list[int]
    text: str
    finished: Finished

    @property
    def cached(self) -> int:
        return self.finished.usage.cached_prompt_tokens


def decode(
    backend: MlxLmBackend, plan: DecodePlan, cancelled: threading.Event, received_at: float
) -> list[DecodeEvent]:
    """One generation through what the scheduler runs it with: OneAtATime and a
    SequenceDecoder, a step at a time, dropped after a step once cancelled."""
    stepper = OneAtATime(backend)
    sequence = stepper.start(plan.sequence)
    assert sequence is not None
    decoder = SequenceDecoder(backend, plan, received_at, sequence.cached_prompt_tokens)
    events: list[DecodeEvent] = []
    try:
        while not decoder.done:
            (sampled,) = stepper.step([sequence], lambda: None)
            if cancelled.is_set():
                break
            assert sampled is not None
            events.extend(decoder.push(sampled.token))
    finally:
        stepper.finish(sequence)
    return events


def run(
    backend: MlxLmBackend,
    prompt_ids: list[int],
    max_tokens: int = 12,
    sampling: SamplingParams | None = None,
    cancelled: threading.Event | None = None,
) -> Run:
    sequence = SequenceRequest(tuple(prompt_ids), sampling or params(), max_tokens)
    plan = DecodePlan(sequence, stop=(), time_limit_s=None)
    events = list(decode(backend, plan, cancelled or threading.Event(), time.monotonic()))
    deltas = [event for event in events if isinstance(event, Delta)]
    finished = events[-1]
    assert isinstance(finished, Finished)
    ids = [token for delta in deltas for token in delta.token_ids]
    return Run(ids, "".join(delta.text for delta in deltas), finished)


def run_checkpoint(path: Path, prompt_ids: list[int]) -> Run:
    """`run` on a checkpoint loaded for this call alone."""
    from service.backends.mlx_lm import MlxLmBackend, MlxLmOptions

    loaded = MlxLmBackend(path, MlxLmOptions(context_size=4096))
    try:
        return run(loaded, prompt_ids)
    finally:
        loaded.close()


def mlx_lm_greedy(
    model: Any, prompt_ids: list[int], count: int, **penalties: float | int
) -> list[int]:
    """What mlx-lm itself generates greedily after the prompt, from an empty cache."""
    from mlx_lm.generate import generate_step
    from mlx_lm.sample_utils import make_logits_processors, make_sampler

    processors = make_logits_processors(**penalties)  # type: ignore[arg-type]
    steps = generate_step(
        mx.array(prompt_ids),
        model,
        max_tokens=count,
        sampler=make_sampler(temp=0.0),
        logits_processors=processors or None,
    )
    return [int(token) for token, _ in steps]


def until_end(backend: MlxLmBackend, tokens: list[int]) -> list[int]:
    """The tokens the decode loop reports: those before the first end-of-generation."""
    for index, token in enumerate(tokens):
        if backend.is_end_of_generation(token):
            return tokens[:index]
    return tokens


def test_greedy_decoding_repeats_and_reuses_the_prompt_cache(backend: MlxLmBackend) -> None:
    prompt = backend.tokenize(FOX, add_bos=False)
    first = run(backend, prompt)
    second = run(backend, prompt)
    assert first.token_ids
    assert second.token_ids == first.token_ids
    assert second.text == first.text
    # Everything but the last prompt token, which is evaluated again for fresh logits.
    assert second.cached == len(prompt) - 1


@pytest.mark.parametrize("text", [FOX, PARIS, "naïve café ☃"], ids=["fox", "paris", "accents"])
def test_greedy_tokens_are_what_mlx_lm_generates(
    backend: MlxLmBackend, reference: Any, text: str
) -> None:
    prompt = backend.tokenize(text, add_bos=False)
    expected = until_end(backend, mlx_lm_greedy(reference, prompt, 16))
    assert expected
    result = run(backend, prompt, max_tokens=16)
    assert result.token_ids == expected
    assert result.finished.usage.completion_tokens == len(expected)


def test_same_seed_gives_the_same_sampled_text(backend: MlxLmBackend) -> None:
    prompt = backend.tokenize(FOX, add_bos=False)
    texts = [run(backend, prompt, 16, params(1.0, seed=42)).text for _ in range(2)]
    other_seed = run(backend, prompt, 16, params(1.0, seed=43)).text
    assert texts[0]
    assert texts[0] == texts[1]
    assert other_seed != texts[0]  # it does sample, rather than decode greedily


def test_max_tokens_ends_with_length(backend: MlxLmBackend) -> None:
    result = run(backend, backend.tokenize(PARIS, add_bos=False), max_tokens=5)
    assert result.finished.finish_reason is FinishReason.LENGTH
    assert result.finished.usage.completion_tokens == 5
    assert len(result.token_ids) == 5


def test_the_cache_holds_what_was_generated_when_the_loop_stops_early(
    backend: MlxLmBackend, reference: Any
) -> None:
    prompt = backend.tokenize(PARIS, add_bos=False)
    generated = run(backend, prompt, max_tokens=4).token_ids
    follow_up = prompt + generated + backend.tokenize(" The capital", add_bos=False)
    result = run(backend, follow_up)
    assert result.cached == len(prompt) + 4
    assert result.token_ids == until_end(backend, mlx_lm_greedy(reference, follow_up, 12))


def test_a_diverging_prompt_reuses_only_the_shared_prefix(
    backend: MlxLmBackend, reference: Any
) -> None:
    shared = backend.tokenize("Once upon a time", add_bos=False)
    first = shared + backend.tokenize(" a model was", add_bos=False)
    other = shared + backend.tokenize(" tests ran", add_bos=False)
    assert first[len(shared)] != other[len(shared)]
    run(backend, first)
    result = run(backend, other)
    assert result.cached == len(shared)
    assert result.token_ids == until_end(backend, mlx_lm_greedy(reference, other, 12))


def test_a_cancelled_request_leaves_the_cache_consistent(
    backend: MlxLmBackend, reference: Any
) -> None:
    prompt = backend.tokenize(FOX, add_bos=False)
    cancelled = threading.Event()
    cancelled.set()
    plan = DecodePlan(SequenceRequest(tuple(prompt), params(), 12), (), None)
    assert list(decode(backend, plan, cancelled, time.monotonic())) == []
    result = run(backend, prompt)
    assert result.cached == len(prompt) - 1
    assert result.token_ids == until_end(backend, mlx_lm_greedy(reference, prompt, 12))


def test_a_new_request_finishes_an_abandoned_stream_first(
    backend: MlxLmBackend, reference: Any
) -> None:
    prompt = backend.tokenize(PARIS, add_bos=False)
    abandoned = backend.generate(prompt, params()).tokens
    next(abandoned), next(abandoned)
    run(backend, backend.tokenize(FOX, add_bos=False))
    abandoned.close()  # late, as a garbage-collected generator would be
    result = run(backend, prompt)
    assert result.token_ids == until_end(backend, mlx_lm_greedy(reference, prompt, 12))


def test_repetition_penalty_counts_the_cached_prefix(backend: MlxLmBackend, reference: Any) -> None:
    # Repeats the penalty window does not see when it ignores the cached prefix.
    prompt = backend.tokenize("red, yellow and blue. red, yellow and", add_bos=False)
    run(backend, prompt)
    penalized = run(backend, prompt, sampling=params(repeat_penalty=1.5))
    expected = until_end(backend, mlx_lm_greedy(reference, prompt, 12, repetition_penalty=1.5))
    assert penalized.cached == len(prompt) - 1
    assert penalized.token_ids == expected
    assert expected != until_end(backend, mlx_lm_greedy(reference, prompt, 12))


def test_presence_and_frequency_penalties_are_mlx_lms(
    backend: MlxLmBackend, reference: Any
) -> None:
    prompt = backend.tokenize("red, yellow and blue. red, yellow and", add_bos=False)
    sampling = params(presence_penalty=1.5, frequency_penalty=0.8)
    penalized = run(backend, prompt, sampling=sampling)
    expected = mlx_lm_greedy(
        reference,
        prompt,
        12,
        presence_penalty=1.5,
        presence_context_size=20,
        frequency_penalty=0.8,
        frequency_context_size=20,
    )
    assert penalized.token_ids == until_end(backend, expected)
    assert expected != mlx_lm_greedy(reference, prompt, 12)


def test_token_bytes_join_into_the_text(backend: MlxLmBackend) -> None:
    text = "naïve café ☃, 日本\n\ttabs ~{}`|"
    pieces = [backend.token_bytes(token) for token in backend.tokenize(text, add_bos=False)]
    assert b"".join(pieces) == text.encode("utf-8")
    # Some characters are split over tokens, which the decode loop must join.
    assert any(not _is_utf8(piece) for piece in pieces)


def _is_utf8(piece: bytes) -> bool:
    try:
        piece.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def test_a_rendered_chat_template_gives_special_token_ids(backend: MlxLmBackend) -> None:
    messages = (ChatMessage("user", "What is 2+2?"),)
    text = render_chat(backend.chat_template, messages, backend.template_tokens, "tiny")
    assert text.startswith(IM_START)
    ids = backend.tokenize(text, add_bos=False)
    (im_start,) = backend.tokenize(IM_START, add_bos=False)
    (im_end,) = backend.tokenize(IM_END, add_bos=False)
    assert ids[0] == im_start
    assert ids.count(im_start) == 2  # the user's turn and the assistant's
    assert ids.count(im_end) == 1
    assert backend.token_bytes(im_start) == b""  # a special token is not text


def test_the_eos_token_ends_the_turn(backend: MlxLmBackend) -> None:
    (im_end,) = backend.tokenize(IM_END, add_bos=False)
    (im_start,) = backend.tokenize(IM_START, add_bos=False)
    assert backend.is_end_of_generation(im_end)
    assert not backend.is_end_of_generation(im_start)
    assert not backend.is_end_of_generation(backend.tokenize("fox", add_bos=False)[0])
    assert backend.template_tokens == {"bos_token": "", "eos_token": IM_END}


def test_an_eos_token_the_model_produces_ends_generation_with_end_of_turn(
    backend: MlxLmBackend, checkpoint: Path, reference: Any, tmp_path: Path
) -> None:
    # Random weights rarely choose <|im_end|>; so the copy also declares the
    # token they choose third an eos token, as some models list several.
    prompt = backend.tokenize(FOX, add_bos=False)
    greedy = mlx_lm_greedy(reference, prompt, 3)
    assert greedy[2] not in greedy[:2]
    (im_end,) = backend.tokenize(IM_END, add_bos=False)
    copy = _copy_checkpoint(checkpoint, tmp_path)
    _edit_config(copy, eos_token_id=[im_end, greedy[2]])
    result = run_checkpoint(copy, prompt)
    assert result.finished.finish_reason is FinishReason.END_OF_TURN
    assert result.token_ids == greedy[:2]
    assert result.finished.usage.completion_tokens == 2


def test_eos_ids_in_generation_config_replace_those_in_config(
    backend: MlxLmBackend, checkpoint: Path, reference: Any, tmp_path: Path
) -> None:
    # As transformers and mlx-lm's loader read a checkpoint: config.json's
    # greedy[1] would stop after one token, generation_config.json's list wins.
    prompt = backend.tokenize(FOX, add_bos=False)
    greedy = mlx_lm_greedy(reference, prompt, 3)
    assert len(set(greedy)) == 3
    (im_end,) = backend.tokenize(IM_END, add_bos=False)
    copy = _copy_checkpoint(checkpoint, tmp_path)
    _edit_config(copy, eos_token_id=greedy[1])
    stated = {**GENERATION_CONFIG, "eos_token_id": [im_end, greedy[2]]}
    (copy / "generation_config.json").write_text(json.dumps(stated))
    result = run_checkpoint(copy, prompt)
    assert result.finished.finish_reason is FinishReason.END_OF_TURN
    assert result.token_ids == greedy[:2]


def test_context_length_is_capped_by_the_trained_window(checkpoint: Path) -> None:
    from service.backends.mlx_lm import MlxLmBackend, MlxLmOptions

    for requested, expected in [(4096, MAX_POSITION_EMBEDDINGS), (128, 128)]:
        backend = MlxLmBackend(checkpoint, MlxLmOptions(context_size=requested))
        assert backend.context_length == expected
        backend.close()


def test_sampling_defaults_come_from_generation_config(backend: MlxLmBackend) -> None:
    from service.backends.mlx_lm import BACKEND_NAME

    assert backend.name == BACKEND_NAME
    assert backend.sampling_defaults() == SamplingDefaults(
        temperature=0.6, top_p=0.9, top_k=20, repeat_penalty=1.1
    )


def test_an_unreadable_generation_config_leaves_the_defaults(
    checkpoint: Path, tmp_path: Path
) -> None:
    from service.backends.mlx_lm import MlxLmBackend, MlxLmOptions

    copy = _copy_checkpoint(checkpoint, tmp_path)
    (copy / "generation_config.json").write_text("{nope")
    backend = MlxLmBackend(copy, MlxLmOptions(context_size=4096))
    assert backend.sampling_defaults() == SamplingDefaults()
    backend.close()


def test_a_generation_config_nested_without_end_refuses_the_load(
    checkpoint: Path, tmp_path: Path
) -> None:
    from service.backends.mlx_lm import MlxLmBackend, MlxLmOptions

    copy = _copy_checkpoint(checkpoint, tmp_path)
    (copy / "generation_config.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(NotSupported, match="recursion"):  # mlx-lm's own reading of it
        MlxLmBackend(copy, MlxLmOptions(context_size=4096))


def test_a_qwen_like_tokenizer_adds_no_bos(backend: MlxLmBackend) -> None:
    assert not backend.adds_bos
    assert backend.tokenize(FOX, add_bos=True) == backend.tokenize(FOX, add_bos=False)


def test_a_llama3_like_checkpoint_adds_its_bos_only_when_asked(tmp_path: Path) -> None:
    from service.backends.mlx_lm import MlxLmBackend, MlxLmOptions

    directory = build_tiny_checkpoint(tmp_path / "llama3", with_bos=True)
    backend = MlxLmBackend(directory, MlxLmOptions(context_size=4096))
    try:
        (bos,) = backend.tokenize(BEGIN_OF_TEXT, add_bos=False)
        assert backend.adds_bos
        assert backend.template_tokens["bos_token"] == BEGIN_OF_TEXT
        assert backend.tokenize(FOX, add_bos=True) == [bos, *backend.tokenize(FOX, add_bos=False)]
        assert bos not in backend.tokenize(FOX, add_bos=False)
        assert backend.sampling_defaults() == SamplingDefaults()  # no generation_config.json
    finally:
        backend.close()


def test_close_is_idempotent_and_final(checkpoint: Path) -> None:
    from service.backends.mlx_lm import MlxLmBackend, MlxLmOptions

    backend = MlxLmBackend(checkpoint, MlxLmOptions(context_size=4096))
    backend.close()
    backend.close()
    with pytest.raises(BackendFailure, match="closed"):
        backend.generate([1, 2, 3], params())


def _copy_checkpoint(checkpoint: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(checkpoint, tmp_path / "copy"))


def _edit_config(directory: Path, **changes: Any) -> None:
    config_file = directory / "config.json"
    config = json.loads(config_file.read_text())
    config.update(changes)
    config_file.write_text(json.dumps(config))


def _remove(*names: str) -> Callable[[Path], None]:
    def mutate(directory: Path) -> None:
        for name in names:
            for file in directory.glob(name):
                file.unlink()

    return mutate


BREAKAGES: dict[str, Callable[[Path], object]] = {
    "no-config": _remove("config.json"),
    "no-weights": _remove("model*.safetensors"),
    "no-tokenizer": _remove("tokenizer.json", "tokenizer_config.json"),
    "config-not-json": lambda d: (d / "config.json").write_text("{nope"),
    "unknown-model-type": lambda d: _edit_config(d, model_type="no-such-architecture"),
    "weights-of-another-shape": lambda d: _edit_config(d, hidden_size=64),
    "corrupt-weights": lambda d: (d / "model.safetensors").write_bytes(b"not safetensors"),
}


@pytest.mark.parametrize("breakage", BREAKAGES, ids=list(BREAKAGES))
def test_a_broken_checkpoint_is_refused_by_name(
    checkpoint: Path, tmp_path: Path, breakage: str
) -> None:
    from service.backends.mlx_lm import MlxLmBackend, MlxLmOptions

    broken = _copy_checkpoint(checkpoint, tmp_path)
    BREAKAGES[breakage](broken)
    with pytest.raises(NotSupported, match=f"mlx-lm cannot load {broken.name}: ") as failure:
        MlxLmBackend(broken, MlxLmOptions(context_size=4096))
    assert str(tmp_path) not in failure.value.message  # the server's paths stay private


def test_a_missing_directory_is_refused_not_downloaded(tmp_path: Path) -> None:
    from service.backends.mlx_lm import MlxLmBackend, MlxLmOptions

    missing = tmp_path / "no-such-model"
    with pytest.raises(NotSupported, match="no-such-model: it is not a directory") as failure:
        MlxLmBackend(missing, MlxLmOptions(context_size=4096))
    assert str(tmp_path) not in failure.value.message


# Gemma 3's layout: the rotating cache of the sliding layer cannot be trimmed
# once it has wrapped past its window, so a snapshot of the prefix serves.


@pytest.fixture(scope="module")
def gemma_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("mlx") / "tiny-gemma"
    return build_tiny_checkpoint(directory, architecture="gemma3_text")


@pytest.fixture
def gemma(gemma_checkpoint: Path) -> Iterator[MlxLmBackend]:
    """A backend of its own per test: what its cache holds is the test's business."""
    from service.backends.mlx_lm import MlxLmBackend, MlxLmOptions

    backend = MlxLmBackend(gemma_checkpoint, MlxLmOptions(context_size=4096))
    yield backend
    backend.close()


def cold_run(checkpoint: Path, prompt_ids: list[int]) -> list[int]:
    """The tokens a fresh backend, with nothing cached, generates after the prompt."""
    from service.backends.mlx_lm import MlxLmBackend, MlxLmOptions

    fresh = MlxLmBackend(checkpoint, MlxLmOptions(context_size=4096))
    try:
        result = run(fresh, prompt_ids)
    finally:
        fresh.close()
    assert result.cached == 0
    return result.token_ids


def test_a_turn_that_leaves_out_the_generated_tokens_starts_from_the_snapshot(
    gemma: MlxLmBackend, gemma_checkpoint: Path
) -> None:
    first = gemma.tokenize(STORY, add_bos=False)
    assert len(first) > SLIDING_WINDOW
    generated = run(gemma, first).token_ids
    second = first + gemma.tokenize(" It could not say much.", add_bos=False)
    assert second[len(first)] != generated[0]  # the live cache would need trimming
    result = run(gemma, second)
    assert result.cached == len(first) - 1
    assert result.token_ids == cold_run(gemma_checkpoint, second)


def test_a_repeated_prompt_starts_from_its_own_snapshot(
    gemma: MlxLmBackend, gemma_checkpoint: Path
) -> None:
    # The snapshot is a copy: generating after it must not move what it holds.
    prompt = gemma.tokenize(STORY, add_bos=False)
    first = run(gemma, prompt)
    second = run(gemma, prompt)
    assert second.cached == len(prompt) - 1
    assert first.token_ids == second.token_ids == cold_run(gemma_checkpoint, prompt)


def test_a_prompt_that_extends_the_live_cache_reuses_it(
    gemma: MlxLmBackend, gemma_checkpoint: Path
) -> None:
    prompt = gemma.tokenize(STORY, add_bos=False)
    generated = run(gemma, prompt, max_tokens=4).token_ids
    follow_up = prompt + generated + gemma.tokenize(" The end.", add_bos=False)
    result = run(gemma, follow_up)
    assert result.cached == len(prompt) + 4  # more than the snapshot holds
    assert result.token_ids == cold_run(gemma_checkpoint, follow_up)


def test_a_prompt_sharing_nothing_starts_cold(gemma: MlxLmBackend, gemma_checkpoint: Path) -> None:
    from mlx_lm.utils import load

    story = gemma.tokenize(STORY, add_bos=False)
    run(gemma, story)
    other = gemma.tokenize(PARIS, add_bos=False)
    assert other[0] != story[0]
    result = run(gemma, other)
    assert result.cached == 0
    # Our own prefill, then generate_step from the last token: what mlx-lm does alone.
    model = load(str(gemma_checkpoint))[0]
    assert result.token_ids == until_end(gemma, mlx_lm_greedy(model, other, 12))


def test_repetition_penalty_counts_the_prefilled_prompt(
    gemma: MlxLmBackend, gemma_checkpoint: Path
) -> None:
    # generate_step sees only the last prompt token; the rest was prefilled.
    from mlx_lm.utils import load

    prompt = gemma.tokenize("red, yellow and blue. red, yellow and", add_bos=False)
    penalized = run(gemma, prompt, sampling=params(repeat_penalty=1.5))
    model = load(str(gemma_checkpoint))[0]
    expected = until_end(gemma, mlx_lm_greedy(model, prompt, 12, repetition_penalty=1.5))
    assert penalized.token_ids == expected
    assert expected != until_end(gemma, mlx_lm_greedy(model, prompt, 12))
