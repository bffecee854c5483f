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
        return _read_only(cache_dir, what)
    if exc.errno in (errno.EACCES, errno.EPERM):
        return _not_permitted(cache_dir, str(where), what)
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        # The cache itself may be what is wrong (a file where a folder should be).
        return unwritable_cache(cache_dir, what) or Aborted(
            f"{what}: {where} disappeared from the hub cache while the pull was writing it "
            "(another server or `hf cache delete` removed it?); retry the pull"
        )
    return None


def unwritable_cache(cache_dir: Path | str, what: str) -> ServiceError | None:
    """Why nothing can be written in the hub cache, seen before a pull starts: the
    cache (or, where it does not exist yet, the nearest folder above it, where it
    would be made) is on a read-only file system, is not this server's to write, or
    lies under a file. None when it can be written."""
    nearest = existing_parent(cache_dir)
    if not os.path.isdir(nearest):
        return NotSupported(
            f"{what}: the hub cache {os.path.abspath(cache_dir)} cannot be made: {nearest} "
            "is a file, not a folder; point --hf-cache-dir (or HF_HUB_CACHE) at a folder"
        )
    try:
        read_only = bool(os.statvfs(nearest).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    if read_only:
        return _read_only(cache_dir, what)
    if not os.access(nearest, os.W_OK | os.X_OK):
        return _not_permitted(cache_dir, nearest, what)
    return None


def _read_only(cache_dir: Path | str, what: str) -> NotSupported:
    return NotSupported(
        f"{what}: the hub cache {os.path.realpath(cache_dir)} is not writable (a read-only "
        f"file system, mounted at {mount_point(cache_dir)}): mount a writable volume there, "
        "or point --hf-cache-dir (or HF_HUB_CACHE) at one"
    )


def _not_permitted(cache_dir: Path | str, where: str, what: str) -> NotSupported:
    return NotSupported(
        f"{what}: the hub cache {os.path.realpath(cache_dir)} is not writable: this server "
        f"(uid {os.getuid()}, gid {os.getgid()}) may not write {where}; give it write "
        "access there (in Kubernetes, the volume's fsGroup), or point --hf-cache-dir (or "
        "HF_HUB_CACHE) at a folder it may write"
    )


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
