"""How engine processes end: exit causes, OOM counters, output tails, crash backoff."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from service.engine.crash_backoff import CrashHistory
from service.engine.exit_cause import OutputTail, describe_exit, oom_kill_count


def test_signal_is_named_with_its_meaning() -> None:
    assert describe_exit(-signal.SIGSEGV, None, None) == (
        "killed by signal SIGSEGV (segmentation fault)"
    )


def test_nonzero_status() -> None:
    assert describe_exit(3, 0, 0) == "exited with status 3"


def test_unknown_signal_still_reads() -> None:
    assert describe_exit(-200, None, None) == "killed by signal 200"


def test_sigkill_with_oom_count_rise_is_the_oom_killer() -> None:
    assert describe_exit(-signal.SIGKILL, 4, 5) == "killed by the OOM killer (out of memory)"


def test_sigkill_without_oom_count_rise_is_a_plain_signal() -> None:
    assert describe_exit(-signal.SIGKILL, 4, 4) == "killed by signal SIGKILL (killed)"


@pytest.mark.parametrize(("before", "after"), [(None, None), (None, 1), (1, None)])
def test_sigkill_with_missing_counters_is_a_plain_signal(before, after) -> None:
    assert describe_exit(-signal.SIGKILL, before, after).startswith("killed by signal SIGKILL")


def test_real_segfault_is_described() -> None:
    code = "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"
    child = subprocess.Popen([sys.executable, "-c", code])
    child.wait(timeout=60)
    assert "SIGSEGV" in describe_exit(child.returncode, None, None)


def test_oom_kill_count_on_this_machine_never_raises() -> None:
    count = oom_kill_count()
    assert count is None or (isinstance(count, int) and count >= 0)


def _fake_cgroup(tmp_path: Path, own: str, events_at: str | None) -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    (root / own.strip("/")).mkdir(parents=True)
    if events_at is not None:
        events = root / events_at.strip("/") / "memory.events"
        events.write_text("low 0\nhigh 0\nmax 2\noom 3\noom_kill 7\noom_group_kill 0\n")
    proc = tmp_path / "proc_cgroup"
    proc.write_text(f"1:memory:/elsewhere\n0::{own}\n")
    return root, proc


def test_oom_kill_count_reads_own_cgroup(tmp_path: Path) -> None:
    root, proc = _fake_cgroup(tmp_path, "/app.slice/svc", "/app.slice/svc")
    assert oom_kill_count(root, proc) == 7


def test_oom_kill_count_walks_up_to_a_parent(tmp_path: Path) -> None:
    root, proc = _fake_cgroup(tmp_path, "/app.slice/svc/leaf", "/app.slice")
    assert oom_kill_count(root, proc) == 7


def test_oom_kill_count_none_without_memory_events(tmp_path: Path) -> None:
    root, proc = _fake_cgroup(tmp_path, "/app.slice/svc", None)
    assert oom_kill_count(root, proc, tmp_path / "no-vmstat") is None


def test_oom_kill_count_none_without_cgroup_v2(tmp_path: Path) -> None:
    proc = tmp_path / "proc_cgroup"
    proc.write_text("4:memory:/x\n1:cpu:/\n")
    no_vmstat = tmp_path / "no-vmstat"
    assert oom_kill_count(tmp_path, proc, no_vmstat) is None
    assert oom_kill_count(tmp_path, tmp_path / "missing", no_vmstat) is None


def test_without_a_cgroup_counter_the_machine_count_is_used(tmp_path: Path) -> None:
    root, proc = _fake_cgroup(tmp_path, "/", None)
    vmstat = tmp_path / "vmstat"
    vmstat.write_text("pgfault 100\noom_kill 7\n")
    assert oom_kill_count(root, proc, vmstat) == 7


def test_output_tail_keeps_the_last_lines_cut_short() -> None:
    tail = OutputTail(max_lines=3, max_chars=5)
    for line in ["one\n", "two\n", "three\n", "a much longer line\n"]:
        tail.add(line)
    assert tail.lines() == ["two", "three", "a muc"]
    assert tail.text() == "two\nthree\na muc"


def test_output_tail_defaults() -> None:
    tail = OutputTail()
    for n in range(30):
        tail.add(f"{n}" + "x" * 600)
    lines = tail.lines()
    assert len(lines) == 20
    assert lines[0].startswith("10x")
    assert all(len(line) == 500 for line in lines)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def test_third_crash_refuses_with_count_window_and_cause() -> None:
    clock = FakeClock()
    history = CrashHistory(limit=3, window_s=600.0, clock=clock)
    history.record("x", "exited with status 1")
    clock.now += 10
    history.record("x", "exited with status 2")
    assert history.refusal("x") is None
    clock.now += 78
    history.record("x", "killed by signal SIGSEGV (segmentation fault)")
    message = history.refusal("x")
    assert message is not None
    assert "model 'x' crashed 3 times in the last 10 minutes" in message
    assert "(last: killed by signal SIGSEGV (segmentation fault))" in message
    # The oldest crash leaves the window 600 s after it: 512 s from now.
    assert "in 512 s" in message
    assert "22:23:20 UTC" in message
    assert history.crashes("x") == 3


def test_serves_again_after_the_window() -> None:
    clock = FakeClock()
    history = CrashHistory(limit=3, window_s=600.0, clock=clock)
    for _ in range(3):
        history.record("x", "exited with status 1")
        clock.now += 1
    assert history.refusal("x") is not None
    clock.now += 596  # one second before the first crash is 600 s old
    assert history.refusal("x") is not None
    clock.now += 1
    assert history.refusal("x") is None
    assert history.crashes("x") == 2
    clock.now += 600
    assert history.crashes("x") == 0


def test_window_in_seconds_when_not_whole_minutes() -> None:
    clock = FakeClock()
    history = CrashHistory(limit=1, window_s=90.0, clock=clock)
    history.record("x", "exited with status 1")
    message = history.refusal("x")
    assert message is not None
    assert "in the last 90 seconds" in message


def test_limit_zero_never_refuses() -> None:
    history = CrashHistory(limit=0, clock=FakeClock())
    for _ in range(10):
        history.record("x", "exited with status 1")
    assert history.refusal("x") is None
    assert history.crashes("x") == 0


def test_models_are_counted_apart() -> None:
    history = CrashHistory(limit=2, clock=FakeClock())
    history.record("a", "exited with status 1")
    history.record("a", "exited with status 1")
    history.record("b", "exited with status 1")
    assert history.refusal("a") is not None
    assert history.refusal("b") is None
    assert history.crashes("b") == 1
