"""How an engine process ended, in words a client and a log reader can use.

An engine that dies takes its model with it; the front process only sees a
return code. This module turns that code (and, for SIGKILL, the cgroup's
OOM-kill counter) into a short cause, and keeps the last lines the child
wrote so the error can show what it said before it went.
"""

from __future__ import annotations

import signal
import threading
from collections import deque
from pathlib import Path

# Where cgroup v2 is mounted. A parameter of oom_kill_count, so tests can
# point it at a fake tree.
CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_SELF_CGROUP = Path("/proc/self/cgroup")
# The machine's count of OOM kills (Linux 4.13+), for a process at the cgroup root.
VMSTAT = Path("/proc/vmstat")


def describe_exit(
    returncode: int, oom_kills_before: int | None, oom_kills_after: int | None
) -> str:
    """Words for how a child ended: its exit status, the signal that killed it,
    or the OOM killer when SIGKILL came with a rise in the OOM-kill counter."""
    if returncode >= 0:
        return f"exited with status {returncode}"
    number = -returncode
    if number == signal.SIGKILL and _counter_rose(oom_kills_before, oom_kills_after):
        return "killed by the OOM killer (out of memory)"
    return f"killed by signal {_signal_words(number)}"


def _counter_rose(before: int | None, after: int | None) -> bool:
    # Without both readings we cannot tell an OOM kill from a `kill -9`.
    return before is not None and after is not None and after > before


def _signal_words(number: int) -> str:
    """ "SIGSEGV (segmentation fault)", or as much of it as the platform knows."""
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = str(number)
    try:
        meaning = signal.strsignal(number)
    except ValueError:  # numbers out of range raise rather than answer None
        meaning = None
    return f"{name} ({meaning.lower()})" if meaning else name


def oom_kill_count(
    root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_SELF_CGROUP, vmstat: Path = VMSTAT
) -> int | None:
    """The cgroup v2 `oom_kill` counter of this process's cgroup, else the
    machine's (/proc/vmstat), or None when neither can be read.

    Engines stay in our cgroup, so a rise in this counter around a child's
    SIGKILL means the kernel killed it for memory. Never raises: it only
    sharpens an error message.
    """
    path = _own_cgroup(proc_cgroup)
    count = None if path is None else _nearest_oom_kill(root, path)
    return count if count is not None else _read_oom_kill(vmstat)


def _own_cgroup(proc_cgroup: Path) -> str | None:
    """This process's cgroup v2 path (the `0::` line), e.g. "/user.slice/x"."""
    try:
        text = proc_cgroup.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("0::"):
            return line[len("0::") :].strip() or "/"
    return None


def _nearest_oom_kill(root: Path, cgroup: str) -> int | None:
    # A cgroup without the memory controller has no memory.events of its own;
    # the nearest ancestor that has one counts its descendants' kills too.
    parts = [part for part in cgroup.split("/") if part]
    while True:
        events = root.joinpath(*parts, "memory.events")
        if events.exists():
            return _read_oom_kill(events)
        if not parts:
            return None
        parts.pop()


def _read_oom_kill(events: Path) -> int | None:
    try:
        text = events.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class OutputTail:
    """The last lines a child wrote, bounded in count and width.

    Filled by the thread that drains the child's output and read by whoever
    reports its death, hence the lock. Lines are cut so that one child printing
    a huge line cannot blow up an error message or a log record.
    """

    def __init__(self, max_lines: int = 20, max_chars: int = 500) -> None:
        self._lines: deque[str] = deque(maxlen=max_lines)
        self._max_chars = max_chars
        self._lock = threading.Lock()

    def add(self, line: str) -> None:
        line = line.rstrip("\r\n")[: self._max_chars]
        with self._lock:
            self._lines.append(line)

    def lines(self) -> list[str]:
        with self._lock:
            return list(self._lines)

    def text(self) -> str:
        return "\n".join(self.lines())
