"""Following a path a client named, inside one allowed root, without looking outside it.

`Path.resolve()` and `Path.exists()` follow symlinks wherever they lead and stat
what they find there, so a reply built on them tells an existing outside file
from a missing one. `find` walks a path one component at a time, as the kernel
does, and stops as soon as the next component would lie outside the root:
nothing outside is ever stat'ed, read or listed, and the answer cannot depend
on what is there. `survey` walks a whole directory the same way, within bounds
on its entries and depth, so that a request naming a huge tree costs little.

Both raise OSError for what the file system refuses (ENAMETOOLONG, EACCES,
ELOOP); the caller turns it into a status, with the client's words.
"""

from __future__ import annotations

import errno
import os
import stat
from collections import deque
from dataclasses import dataclass, field
from itertools import islice

# The kernel's own limit on symlinks in one path lookup (ELOOP past it).
MAX_SYMLINKS = 40
# What one request may make the server look at in a directory it names: a
# checkpoint sharded in hundreds of files or a diffusers pipeline fits easily.
MAX_ENTRIES = 4096
MAX_DEPTH = 8


class LeadsOutside(Exception):
    """The path leaves the root; what lies beyond was not looked at."""


class TooLarge(Exception):
    """A directory holds more entries, or deeper ones, than a request may make us walk."""


@dataclass(frozen=True)
class Found:
    """An entry that exists: its real path (no symlinks left), inside the root."""

    path: str
    mode: int

    @property
    def is_file(self) -> bool:
        return stat.S_ISREG(self.mode)

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)


def within(path: str, root: str) -> bool:
    """Whether `path` is `root` or under it, by spelling alone (both normalized, absolute)."""
    return path == root or path.startswith(root.rstrip("/") + "/")


def find(root: str, start: str, relative: str) -> Found | None:
    """`start/relative` with every symlink followed; None when some component is missing.

    `root` and `start` are real paths and `start` lies inside `root`. Raises
    LeadsOutside before the first lookup that would be outside `root`.
    """
    current, mode = start, None
    pending = deque(relative.split("/"))
    links = 0
    while pending:
        part = pending.popleft()
        if part in ("", "."):
            continue
        # `current` has no symlinks in it, so '..' is its parent, as for the kernel.
        candidate = os.path.dirname(current) if part == ".." else os.path.join(current, part)
        _require_on_the_way(candidate, root)
        info = _lstat(candidate)
        if info is None:
            return None
        if stat.S_ISLNK(info.st_mode):
            links += 1
            if links > MAX_SYMLINKS:
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP))
            target = os.readlink(candidate)
            pending.extendleft(reversed(target.split("/")))
            if target.startswith("/"):
                current, mode = "/", None
            continue
        current, mode = candidate, info.st_mode
    if not within(current, root):
        raise LeadsOutside()
    return Found(current, os.lstat(current).st_mode if mode is None else mode)


def _require_on_the_way(path: str, root: str) -> None:
    # Inside the root, or one of its ancestors (a relative symlink may climb up
    # and come back down); anything else is outside and is not looked at.
    if not (within(path, root) or within(root, path)):
        raise LeadsOutside()


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None


@dataclass
class Survey:
    """What a directory holds, each entry named relative to it with '/'."""

    entries: list[tuple[str, Found]] = field(default_factory=list)
    outside: list[str] = field(default_factory=list)  # entries leading outside the root


def survey(root: str, directory: str) -> Survey:
    """Every entry under `directory` (a real path inside `root`), breadth first.

    Directories reached through symlinks are walked too, as loaders follow them;
    each real directory once. Raises TooLarge past MAX_ENTRIES or MAX_DEPTH.
    """
    result = Survey()
    queue = deque([(directory, "", 0)])
    seen = {directory}
    budget = MAX_ENTRIES
    while queue:
        real, prefix, depth = queue.popleft()
        entries = _listing(real, budget)
        budget -= len(entries)
        if entries and depth >= MAX_DEPTH:
            raise TooLarge()
        for entry in entries:
            try:
                found = _entry(root, real, entry)
            except LeadsOutside:
                result.outside.append(prefix + entry.name)
                continue
            if found is None:
                continue  # a dangling symlink: nothing will be read through it
            result.entries.append((prefix + entry.name, found))
            if found.is_dir and found.path not in seen:
                seen.add(found.path)
                queue.append((found.path, f"{prefix}{entry.name}/", depth + 1))
    return result


def _listing(directory: str, budget: int) -> list[os.DirEntry[str]]:
    """The entries of `directory`, sorted by name; reads at most one past the budget."""
    with os.scandir(directory) as entries:
        listed = list(islice(entries, budget + 1))
    if len(listed) > budget:
        raise TooLarge()
    return sorted(listed, key=lambda entry: entry.name)


def _entry(root: str, directory: str, entry: os.DirEntry[str]) -> Found | None:
    """An entry of a real directory; only symlinks need a walk (the listing knows the rest)."""
    if entry.is_symlink():
        return find(root, directory, entry.name)
    if entry.is_dir(follow_symlinks=False):
        return Found(entry.path, stat.S_IFDIR)
    if entry.is_file(follow_symlinks=False):
        return Found(entry.path, stat.S_IFREG)
    return Found(entry.path, entry.stat(follow_symlinks=False).st_mode)
