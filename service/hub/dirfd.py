"""Paths under the hub cache, walked from its root one folder at a time, never through a link.

Checking a path and then using it by name leaves a gap: another account that
may write in the cache can swap a folder for a symbolic link between the two,
and the write (or the deletion) lands wherever the link leads. So nothing here
takes a path. The cache's root is opened once per operation (the operator
named it: it is trusted as given), and every folder below it is opened
relative to the one above with O_NOFOLLOW | O_DIRECTORY; files are created,
renamed, linked and removed by name relative to their folder's descriptor
(`dir_fd=`). A link where a folder should be is refused (`OutsideCache`,
PERMISSION_DENIED); a link where a file should be is removed as a link or not
opened. A swap after a folder was opened changes nothing: the descriptor still
names the folder that was opened.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator, Sequence

from service.errors import AccessDenied, InvalidRequest, excerpt

DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class OutsideCache(AccessDenied):
    """A folder the cache would use is a symbolic link (planted, or swapped in)."""

    def __init__(self, path: str, root: str) -> None:
        super().__init__(
            f"{path} in the hub cache leads outside it (to {os.path.realpath(path)}): this "
            f"server writes and deletes only inside {root}, and follows no link there. "
            "Replace the link with a folder, or point --hf-cache-dir at the folder it leads to"
        )
        self.path = path


def parts_of(relative: str) -> list[str]:
    """A relative path's names; InvalidRequest for one that is empty, absolute or climbs."""
    parts = relative.split("/")
    if not relative or any(part in ("", ".", "..") for part in parts):
        raise InvalidRequest(f"{excerpt(relative)} is not a path inside the hub cache")
    return parts


@contextlib.contextmanager
def opened(fd: int) -> Iterator[int]:
    try:
        yield fd
    finally:
        os.close(fd)


def open_root(root: str, *, create: bool = False) -> int:
    """The cache's root folder (created if asked), as the operator named it."""
    if create:
        os.makedirs(root, exist_ok=True)
    return os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def open_folder(fd: int, parts: Sequence[str], *, create: bool, label: str) -> int:
    """The folder `parts` below the folder `fd`, each step opened without following a
    link (created where absent, if asked). `label` is the path above, for messages.
    OutsideCache for a link on the way; FileNotFoundError / NotADirectoryError as the
    file system says for an absent folder or a file in its place."""
    root = label
    current = os.dup(fd)
    try:
        for part in parts:
            label = os.path.join(label, part)
            child = _step(current, part, create=create, label=label, root=root)
            os.close(current)
            current = child
    except BaseException:
        os.close(current)
        raise
    return current


@contextlib.contextmanager
def folder(fd: int, parts: Sequence[str], *, create: bool = False, label: str) -> Iterator[int]:
    with opened(open_folder(fd, parts, create=create, label=label)) as child:
        yield child


def _step(fd: int, name: str, *, create: bool, label: str, root: str) -> int:
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o755, dir_fd=fd)
    try:
        return os.open(name, DIRECTORY, dir_fd=fd)
    except OSError as exc:
        if exc.errno in (errno.ENOTDIR, errno.ELOOP) and is_link(fd, name):
            raise OutsideCache(label, root) from None
        exc.filename = label
        raise


def entry(fd: int, name: str) -> os.stat_result | None:
    """What `name` in the folder is, not following a link; None if absent."""
    try:
        return os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def is_link(fd: int, name: str) -> bool:
    info = entry(fd, name)
    return info is not None and stat.S_ISLNK(info.st_mode)


def read_link(fd: int, name: str) -> str | None:
    """A symbolic link's own text; None if `name` is absent or not a link."""
    try:
        return os.readlink(name, dir_fd=fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.EINVAL:  # not a link
            return None
        raise


def open_file(fd: int, name: str, flags: int, mode: int = 0o644, *, label: str) -> int:
    """A file in the folder, opened with O_NOFOLLOW: a link in its place is not followed
    (AccessDenied naming `label`)."""
    try:
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise AccessDenied(f"{label} in the hub cache is a link: not opened") from exc
        exc.filename = label
        raise


def unlink(fd: int, name: str) -> None:
    """Remove a file or link from the folder (a link itself, never what it leads to)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=fd)


def freed_by_unlinking(info: os.stat_result | None) -> int:
    """The bytes removing an entry gives back: a file's blocks when it is its last name;
    nothing for a link, a folder or a file with other names."""
    if info is None or not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        return 0
    return info.st_blocks * 512


def remove_tree(fd: int, name: str) -> int:
    """Remove `name` from the folder `fd`: a folder with everything in it, walked by
    descriptors (links inside go as links), or a file or link. The bytes freed."""
    info = entry(fd, name)
    if info is None:
        return 0
    if not stat.S_ISDIR(info.st_mode):
        unlink(fd, name)
        return freed_by_unlinking(info)
    try:
        child = os.open(name, DIRECTORY, dir_fd=fd)
    except OSError as exc:
        if exc.errno in (errno.ENOTDIR, errno.ELOOP):  # swapped for a link meanwhile
            return remove_tree(fd, name)
        raise
    freed = 0
    with opened(child):
        for inner in names(child):
            freed += remove_tree(child, inner)
    os.rmdir(name, dir_fd=fd)
    return freed


def names(fd: int) -> list[str]:
    """The entries of a folder, sorted."""
    with os.scandir(fd) as entries:
        return sorted(e.name for e in entries)


def walk_files(fd: int, prefix: str = "") -> Iterator[tuple[int, str, str]]:
    """(folder fd, name, relative path) of every entry under the folder that is not a
    folder (links to folders included, never entered), walked by descriptors."""
    for name in names(fd):
        info = entry(fd, name)
        if info is None:
            continue
        relative = f"{prefix}{name}"
        if not stat.S_ISDIR(info.st_mode):
            yield fd, name, relative
            continue
        try:
            child = os.open(name, DIRECTORY, dir_fd=fd)
        except OSError:
            continue  # swapped meanwhile: not entered
        with opened(child):
            yield from walk_files(child, relative + "/")
