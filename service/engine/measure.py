"""What an engine process holds: its resident memory, and its GPU memory where it uses one."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time

# How long one reading of the GPU's per-process memory stays fresh.
GPU_READING_SECONDS = 5.0


def rss_bytes(pid: int) -> int:
    """Resident memory of `pid` (VmRSS: its own pages and the mapped weights it
    touched); 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


class GpuMemory:
    """GPU memory per process, as the NVIDIA driver reports it (nvidia-smi).

    Asked from the event loop, so it never waits for the driver there: it
    answers the last reading and starts a fresh one in a thread when that is
    older than GPU_READING_SECONDS. With no nvidia-smi it answers 0.
    """

    def __init__(self) -> None:
        self._command = shutil.which("nvidia-smi")
        self._by_pid: dict[int, int] = {}
        self._read_at = float("-inf")
        self._reading = threading.Lock()

    def of(self, pid: int) -> int:
        if self._command is None:
            return 0
        if time.monotonic() - self._read_at > GPU_READING_SECONDS and self._reading.acquire(
            blocking=False
        ):
            threading.Thread(target=self._read, daemon=True).start()
        return self._by_pid.get(pid, 0)

    def _read(self) -> None:
        try:
            self._by_pid = query_gpu_memory(self._command or "nvidia-smi")
        finally:
            self._read_at = time.monotonic()
            self._reading.release()


def query_gpu_memory(command: str) -> dict[int, int]:
    """Bytes of GPU memory each process uses, summed over the GPUs; {} on any failure."""
    try:
        output = subprocess.run(
            [command, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    return parse_gpu_memory(output)


def parse_gpu_memory(output: str) -> dict[int, int]:
    """nvidia-smi's `pid, MiB` lines as {pid: bytes}."""
    by_pid: dict[int, int] = {}
    for line in output.splitlines():
        pid, _, mib = line.partition(",")
        try:
            by_pid[int(pid)] = by_pid.get(int(pid), 0) + int(mib.strip()) * (1 << 20)
        except ValueError:
            continue
    return by_pid
