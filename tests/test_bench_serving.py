"""bench.serving's workload and arithmetic: seeded, exact, and computed as stated."""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
from collections.abc import AsyncIterator
from pathlib import Path

import llama_cpp
import pytest

from bench.ceiling import batched_bench_command, parse_table
from bench.py_spy import record_command
from bench.serving import Figures, figures, finished, round_ratios
from bench.targets import Outcome, _arrived, _sse_lines
from bench.workload import Lengths, Texts, parse_range, poisson_gaps, requests
from service.models.embedded import EMBEDDED_MODELS
from tests.conftest import GEMMA


@pytest.fixture(scope="module")
def texts() -> Texts:
    vocabulary = llama_cpp.Llama(
        str(EMBEDDED_MODELS[GEMMA].locate()), vocab_only=True, verbose=False
    )
    return Texts(
        lambda text: list(vocabulary.tokenize(text.encode(), add_bos=False)),
        lambda ids: vocabulary.detokenize(ids).decode("utf-8", errors="ignore"),
        seed=3,
    )


def test_prompts_have_the_drawn_lengths_and_are_distinct(texts: Texts) -> None:
    lengths = Lengths(prompt=(100, 300), output=(32, 64))
    work = requests("random", 20, lengths, texts, seed=3)
    assert all(abs(r.prompt_tokens - texts.count(r.prompt)) == 0 for r in work)
    assert all(100 <= r.prompt_tokens <= 302 for r in work)  # a cut may re-merge a token
    assert all(32 <= r.max_tokens <= 64 for r in work)
    assert len({r.prompt for r in work}) == 20


def test_the_same_seed_gives_the_same_workload(texts: Texts) -> None:
    lengths = Lengths(prompt=(50, 60), output=(8, 16))
    again = Texts(texts._tokenize, texts._detokenize, seed=3)
    first = [r.max_tokens for r in requests("random", 5, lengths, texts, seed=9)]
    assert first == [r.max_tokens for r in requests("random", 5, lengths, again, seed=9)]


def test_shared_prefix_and_multi_turn_shapes(texts: Texts) -> None:
    lengths = Lengths(prompt=(20, 20), output=(10, 10), shared_prefix=100)
    shared = requests("shared-prefix", 4, lengths, texts, seed=1)
    prefix = shared[0].prompt.split("\n")[0]
    assert all(r.prompt.startswith(prefix + "\n") for r in shared)
    turns = requests("multi-turn", 8, lengths, texts, seed=1, turns=4)
    assert [(r.conversation, r.turn) for r in turns[:4]] == [(0, 0), (0, 1), (0, 2), (0, 3)]
    for earlier, later in itertools.pairwise(turns[:4]):
        assert later.prompt.startswith(earlier.prompt)  # each turn repeats the last
        assert later.prompt_tokens > earlier.prompt_tokens


def test_poisson_gaps_average_the_inverse_rate() -> None:
    gaps = poisson_gaps(4000, rate=4.0, seed=0)
    assert statistics.mean(gaps) == pytest.approx(0.25, rel=0.05)
    assert parse_range("150") == (150, 150)
    assert parse_range("100:2000") == (100, 2000)


def test_figures_are_computed_from_what_the_client_saw() -> None:
    outcomes = []
    for start in (0.0, 1.0):
        outcome = Outcome(sent=start, prompt_tokens=10)
        outcome.first = start + 0.5  # TTFT 500 ms
        outcome.output_tokens = 1
        outcome.token_times = [start + 0.6, start + 0.7]  # ITL 100 ms each
        outcome.output_tokens = 3
        outcomes.append(outcome)
    failed = Outcome(sent=0.0, prompt_tokens=10, error="UNAVAILABLE: gone")
    result = figures("x", [*outcomes, failed], seconds=2.0, cpu=0.5, slo=(600, 150))
    assert (result.requests, result.errors) == (3, 1)
    assert result.output_tokens_per_second == 3.0
    assert result.ttft_ms["p50"] == pytest.approx(500)
    assert result.itl_ms["p99"] == pytest.approx(100)
    assert result.goodput_rps == 1.0
    tight = figures("x", outcomes, seconds=2.0, cpu=0.5, slo=(400, 150))
    assert tight.goodput_rps == 0.0
    assert result.client_cpu == 0.25


def test_a_message_of_several_tokens_spreads_its_gap() -> None:
    outcome = Outcome(sent=0.0, prompt_tokens=1)
    _arrived(outcome, 1)
    first = outcome.first
    _arrived(outcome, 4)
    gaps = [b - a for a, b in zip([first, *outcome.token_times], outcome.token_times, strict=False)]
    assert outcome.output_tokens == 5
    assert max(gaps) - min(gaps) < 1e-6  # equal shares of one gap


def test_event_stream_lines_break_at_newlines_only() -> None:
    # llama-server writes U+2028 raw inside its JSON; a str line iterator breaks there.
    event = json.dumps({"content": "a\u2028b\x85"}, ensure_ascii=False).encode()
    sent = [b"data: " + event[:9], event[9:] + b"\r\n\ndata: ", b'{"stop": true}']

    async def lines() -> list[bytes]:
        async def chunks() -> AsyncIterator[bytes]:
            for chunk in sent:
                yield chunk

        return [line async for line in _sse_lines(chunks())]

    got = asyncio.run(lines())
    assert got == [b"data: " + event, b"", b'data: {"stop": true}']
    assert json.loads(got[0][6:])["content"] == "a\u2028b\x85"


# What llama-batched-bench printed on the H200 (2026-12-02), header lines included.
BATCHED_BENCH_TABLE = """\
main: n_kv_max = 65536, n_batch = 2048, n_ubatch = 512, flash_attn = 1, is_pp_shared = 0

|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |
|-------|--------|------|--------|----------|----------|----------|----------|----------|----------|
|   155 |    128 |    1 |    283 |    0.023 |  6739.13 |    0.154 |   830.75 |    0.177 |  1598.17 |
|   155 |    128 |   32 |   9056 |    0.141 | 35109.82 |    0.450 |  9106.65 |    0.591 | 15321.83 |
"""


def test_the_ceiling_is_generated_tokens_over_the_batched_loop_s_whole_run() -> None:
    ceiling = parse_table(BATCHED_BENCH_TABLE, 32, "-no-kvu")
    assert ceiling.output_tokens_per_second == pytest.approx(32 * 128 / 0.591)
    assert ceiling.prefill_seconds == pytest.approx(0.141)
    assert ceiling.step_ms == pytest.approx(450 / 128)
    assert parse_table(BATCHED_BENCH_TABLE, 1, "-kvu").output_tokens_per_second == (
        pytest.approx(128 / 0.177)
    )
    with pytest.raises(ValueError, match="no row for 128"):
        parse_table(BATCHED_BENCH_TABLE, 128, "-kvu")


def test_the_ceiling_runs_in_the_service_s_layout_and_placement() -> None:
    on_gpu = batched_bench_command(
        "bb", "m.gguf", (155, 128), 32, unified=False, gpu_layers=-1, threads=2
    )
    assert on_gpu[on_gpu.index("-npp") + 1 :][:4] == ["155", "-ntg", "128", "-npl"]
    assert {"-no-kvu", "-ngl"} <= set(on_gpu)
    assert "-t" not in on_gpu
    assert int(on_gpu[on_gpu.index("-c") + 1]) >= 32 * (155 + 128)
    on_cpu = batched_bench_command(
        "bb", "m.gguf", (150, 64), 8, unified=True, gpu_layers=0, threads=2
    )
    assert "-kvu" in on_cpu
    assert "-ngl" not in on_cpu
    assert on_cpu[on_cpu.index("-t") + 1] == "2"


def test_py_spy_follows_the_engine_processes_until_stopped_or_for_the_seconds_given() -> None:
    until_stopped = record_command("py-spy", 42, Path("out.txt"))
    assert {"--subprocesses", "--threads", "--nonblocking"} <= set(until_stopped)
    assert until_stopped[until_stopped.index("-p") + 1] == "42"
    assert "-d" not in until_stopped
    timed = record_command("py-spy", 42, Path("out.txt"), seconds=4, native=True)
    assert timed[timed.index("-d") + 1] == "4"
    assert "--native" in timed
    assert "--nonblocking" not in timed  # py-spy refuses the two together


def test_each_configuration_is_printed_as_it_finishes(capsys: pytest.CaptureFixture[str]) -> None:
    outcome = Outcome(sent=0.0, prompt_tokens=10)
    outcome.first, outcome.token_times, outcome.output_tokens = 0.5, [0.6, 0.7], 3
    results: list[Figures] = []
    finished(results, figures("svc greedy on", [outcome], seconds=1.0, cpu=0.1, slo=(600, 150)))
    printed = capsys.readouterr().out
    assert printed.startswith("finished: svc greedy on")
    assert "3.0" in printed  # its output tokens/s, before any other configuration ran
    assert [r.server for r in results] == ["svc greedy on"]


def _row(server: str, tokens_per_second: float) -> Figures:
    outcome = Outcome(sent=0.0, prompt_tokens=10)
    outcome.first, outcome.token_times = 0.5, [0.6]
    outcome.output_tokens = int(tokens_per_second)
    return figures(server, [outcome], seconds=1.0, cpu=0.1, slo=(600, 150))


def test_rounds_compare_each_service_row_with_the_fastest_llama_server_of_its_round() -> None:
    rows = [
        _row("service unified #1", 40),
        _row("service per-sequence #1", 55),
        _row("llama-server[kvu] #1", 50),
        _row("llama-server[no-kvu] #1", 40),
        _row("service unified #2", 60),
        _row("service per-sequence #2", 45),
        _row("llama-server[kvu] #2", 40),
        _row("llama-server[no-kvu] #2", 50),
        _row("service unified #3", 45),  # the third round was cut short before llama-server
    ]
    lines = round_ratios(rows, rounds=3).splitlines()
    assert lines == [
        "service unified / fastest llama-server, by round: 0.80x, 1.20x; median 1.00x",
        "service per-sequence / fastest llama-server, by round: 1.10x, 0.90x; median 1.00x",
    ]
    assert round_ratios(rows[-1:], rounds=3) == "no round finished both servers"
