"""How much memory loaded models may use."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_BUDGET_FRACTION = 0.8


def available_memory_bytes() -> int:
    """Memory the kernel says is available now (MemAvailable), else all of it."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def default_budget_bytes() -> int:
    return int(available_memory_bytes() * DEFAULT_BUDGET_FRACTION)


def format_bytes(count: int) -> str:
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"
