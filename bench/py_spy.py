"""Sampling the service's processes with py-spy while a benchmark loads them.

The model runs in an engine process of its own, so py-spy follows the server's
children (`--subprocesses`); `--threads` keeps the model thread apart from the
event loop's. The output is py-spy's raw format: collapsed stacks, one line per
stack with its sample count (flamegraph.pl and speedscope read it).
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def record_command(
    py_spy: str, pid: int, out: Path, *, seconds: int | None = None, native: bool = False
) -> list[str]:
    """py-spy record of `pid` and its children at 100 Hz into `out`, for `seconds`
    (until interrupted when None)."""
    command = [py_spy, "record", "-r", "100", "-p", str(pid), "-o", str(out)]
    command += ["-f", "raw", "--threads", "--subprocesses"]
    command += ["-d", str(seconds)] if seconds else []
    command += ["--native"] if native else ["--nonblocking"]
    return command


@contextmanager
def recording(py_spy: str | None, pid: int, out: Path) -> Iterator[None]:
    """py-spy samples `pid` while the block runs (nothing when `py_spy` is None)."""
    if not py_spy:
        yield
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    command = record_command(py_spy, pid, out)
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        yield
    finally:
        process.send_signal(signal.SIGINT)  # py-spy writes what it has on SIGINT
        _, errors = process.communicate(timeout=60)
        if process.returncode not in (0, -signal.SIGINT):
            print(f"py-spy exited with status {process.returncode}: {errors.decode()[-300:]}")
        else:
            print(f"py-spy: {out}")
