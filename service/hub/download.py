"""What fetching a hub model would move: admission reports it, Pull carries it out."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Download:
    """What fetching a hub model would move, and whether the disk has room."""

    repo_id: str
    commit: str
    files: dict[str, int]  # the files the backend needs, and their bytes
    free_bytes: int  # on the file system holding the hub cache

    @property
    def total_bytes(self) -> int:
        return sum(self.files.values())

    @property
    def fits_on_disk(self) -> bool:
        return self.total_bytes <= self.free_bytes
