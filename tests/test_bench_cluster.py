"""The pure pieces of bench/cluster.py: reading the launcher's log, the prompts, the tables."""

from __future__ import annotations

import itertools
import json

from bench.cluster import (
    ClusterAddresses,
    Conversation,
    Turn,
    document,
    launcher_command,
    paired_ttft_ms,
    ready_addresses,
    routing_figures,
    routing_row,
    story_prompt,
    table,
)

READY = {
    "listen": "127.0.0.1:40001",
    "admin": "127.0.0.1:40002",
    "replicas": [
        {"address": "127.0.0.1:40011", "pid": 11},
        {"address": "127.0.0.1:40012", "pid": 12},
    ],
    "picker": {"address": "127.0.0.1:40020", "pid": 20},
    "envoy": {"address": "127.0.0.1:40001", "pid": 21},
    "event": "cluster ready",
    "level": "info",
}


def test_ready_line_gives_every_address() -> None:
    assert ready_addresses(json.dumps(READY)) == ClusterAddresses(
        "127.0.0.1:40001", ("127.0.0.1:40011", "127.0.0.1:40012"), "127.0.0.1:40020"
    )


def test_ready_line_without_picker() -> None:
    found = ready_addresses(json.dumps({**READY, "picker": None}))
    assert found is not None
    assert found.picker is None


def test_other_lines_are_not_ready() -> None:
    assert ready_addresses(json.dumps({"event": "started", "role": "envoy"})) is None
    assert ready_addresses("[2026-12-01 10:45:44.074][9868][warning][main] no limit") is None


def test_launcher_command_passes_server_flags_after_the_separator() -> None:
    command = launcher_command(3, ["--threads", "2"], picker=False)
    assert command[command.index("--replicas") + 1] == "3"
    assert "--no-picker" in command[: command.index("--")]
    assert command[command.index("--") + 1 :] == ["--threads", "2"]
    assert "--no-picker" not in launcher_command(3, [], picker=True)


def test_consecutive_story_prompts_differ_from_the_first_character() -> None:
    systems = [story_prompt(index)[0][1] for index in range(12)]
    assert all(a[0] != b[0] for a, b in itertools.pairwise(systems))
    assert len({len(system) for system in systems}) == 1  # as many characters each
    assert len({story_prompt(index)[1] for index in range(12)}) == 1


def test_documents_are_distinct_and_about_as_long_as_asked() -> None:
    first, second = document(0, 1000), document(1, 1000)
    assert first != second
    assert first[:40] != second[:40]
    assert 4000 <= len(first) < 4000 + 1000
    assert document(0, 1000) == first  # the same text on every run


def test_table_is_markdown() -> None:
    text = table(("name", "a", "b"), [["x", "1", "2"]])
    assert text.splitlines() == ["| name | a | b |", "|:---|---:|---:|", "| x | 1 | 2 |"]


def _turn(replica: str, ttft_ms: float, cached: int = 0) -> Turn:
    return Turn(ttft_ms, ttft_ms, 50.0, 8, 1000, cached, replica, "text")


def test_routing_figures_tell_second_turns_there_from_elsewhere() -> None:
    done = [
        Conversation(_turn("a", 900), _turn("a", 40, cached=990)),
        Conversation(_turn("b", 900), _turn("c", 800)),
        Conversation(_turn("c", 900), _turn("a", 1000)),
    ]
    figures = routing_figures(done)
    assert figures["same_replica"] == 1
    assert figures["there_ms"] == 40
    assert figures["elsewhere_ms"] == 900
    assert figures["ttft_ms"] == 800
    assert figures["replicas_used"] == 3
    row = routing_row("least-request", figures, len(done))
    assert row[4:6] == ["1 of 3", "40 / 900"]


def test_routing_row_marks_an_empty_group() -> None:
    done = [Conversation(_turn("a", 900), _turn("a", 40))]
    assert routing_row("picker", routing_figures(done), 1)[5] == "40 / -"


def test_paired_ttft_is_the_median_difference_within_runs() -> None:
    direct = [_turn("a", ttft) for ttft in (100, 200, 300)]
    via = [_turn("b", ttft) for ttft in (110, 190, 500)]
    # The medians differ by -10 ms; within each run: +10, -10, +200.
    assert paired_ttft_ms({"direct": direct, "via": via}) == 10


def test_a_line_that_only_looks_like_json_is_not_ready() -> None:
    assert ready_addresses("{not json") is None
