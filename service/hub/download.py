"""What fetching a hub model would move: admission reports it, Pull carries it out."""

from __future__ import annotations

from dataclasses import dataclass, field

from service.hub.trust import Digest


@dataclass(frozen=True)
class Download:
    """What fetching a hub model would move, and whether the disk has room."""

    repo_id: str
    commit: str
    files: dict[str, int]  # the files the backend needs, and their bytes
    free_bytes: int  # on the file system holding the hub cache
    # Each file's hash, as the hub lists it: what its bytes are checked against.
    digests: dict[str, Digest] = field(default_factory=dict)
    # For a GGUF repo: every GGUF the repo offers (the first part of a split one),
    # with its bytes (all parts), so a client can choose a quantization.
    choices: dict[str, int] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        return sum(self.files.values())

    @property
    def fits_on_disk(self) -> bool:
        return self.total_bytes <= self.free_bytes
