"""The disk under the hub cache: its free space, promised among pulls, and when it is full.

Pulls that each fit but not together would both start and one would fail
late, having filled the disk. So each transfer reserves the bytes it still
has to write, and a new one starts only if it fits in what is free beside
those promises. A disk that fills anyway (something else wrote to it) is the
local disk's fault, and says so: RESOURCE_EXHAUSTED naming the file system.
The other ways the disk says no name their cause too (`cache_failure`).
"""

from __future__ import annotations

import errno
import os
import shutil
import threading
from pathlib import Path

from service.errors import Aborted, NotSupported, Overloaded, ServiceError

# Errors that mean "no room": the disk, or the user's quota on it.
NO_ROOM = (errno.ENOSPC, errno.EDQUOT)


def existing_parent(path: Path | str) -> str:
    """`path`, or the nearest folder above it that exists (the cache may not yet)."""
    current = os.path.abspath(path)
    while not os.path.exists(current) and os.path.dirname(current) != current:
        current = os.path.dirname(current)
    return current


def free_bytes(path: Path | str) -> int:
    """Free bytes on the file system that holds (or would hold) `path`."""
    try:
        return shutil.disk_usage(existing_parent(path)).free
    except OSError:
        return 0


def mount_point(path: Path | str) -> str:
    """The mount point of the file system holding `path`, for messages."""
    current = os.path.realpath(existing_parent(path))
    try:
        device = os.stat(current).st_dev
        while current != "/" and os.stat(os.path.dirname(current)).st_dev == device:
            current = os.path.dirname(current)
    except OSError:
        pass
    return current


def disk_full(cache_dir: Path | str, what: str) -> Overloaded:
    return Overloaded(
        f"{what}: the disk holding the hub cache ({os.path.realpath(cache_dir)}, on the file "
        f"system mounted at {mount_point(cache_dir)}) is full; free space there or point "
        "--hf-cache-dir at a larger one, then pull again"
    )


def cache_failure(exc: OSError, cache_dir: Path | str, what: str) -> ServiceError | None:
    """What an error of the cache's file system means for a pull, with what to do;
    None for an error that is not the cache's to explain."""
    where = exc.filename or os.path.realpath(cache_dir)
    if exc.errno in NO_ROOM:
        return disk_full(cache_dir, what)
    if exc.errno == errno.EROFS:
        return NotSupported(
            f"{what}: the hub cache ({os.path.realpath(cache_dir)}) is on a read-only file "
            f"system (mounted at {mount_point(cache_dir)}); point --hf-cache-dir (or "
            "HF_HUB_CACHE) at a writable folder, e.g. a volume"
        )
    if exc.errno in (errno.EACCES, errno.EPERM):
        return NotSupported(
            f"{what}: this server (uid {os.getuid()}) may not write {where} in the hub cache; "
            "give it write access there, or point --hf-cache-dir at a folder it may write"
        )
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return Aborted(
            f"{what}: {where} disappeared from the hub cache while the pull was writing it "
            "(another server or `hf cache delete` removed it?); retry the pull"
        )
    return None


class Reservations:
    """Bytes that transfers under way have yet to write, and the room left beside them."""

    def __init__(self, cache_dir: Path) -> None:
        self._cache_dir = cache_dir
        self._lock = threading.Lock()
        self._promised: dict[object, int] = {}

    def reserve(self, holder: object, needed: int, what: str) -> None:
        """Promise `needed` bytes to `holder`, or refuse if they do not fit beside the others."""
        with self._lock:
            others = sum(n for key, n in self._promised.items() if key is not holder)
            free = free_bytes(self._cache_dir)
            if needed > free - others:
                raise Overloaded(
                    f"{what} needs {needed} more bytes; the disk holding the hub cache "
                    f"(mounted at {mount_point(self._cache_dir)}) has {free} free, of which "
                    f"{others} are promised to pulls under way. Wait for them, or free space"
                )
            self._promised[holder] = needed

    def written(self, holder: object, count: int) -> None:
        """`count` of the holder's bytes are on disk now: no longer a promise."""
        with self._lock:
            if holder in self._promised:
                self._promised[holder] = max(0, self._promised[holder] - count)

    def release(self, holder: object) -> None:
        with self._lock:
            self._promised.pop(holder, None)
