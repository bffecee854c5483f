"""One repo's folder in the hub cache, in huggingface_hub's layout, written only by us.

    models--owner--name/
      blobs/<hash>                 a whole, verified file, named by its content hash
      blobs/<hash>.incomplete      a transfer under way or interrupted (never served)
      snapshots/<commit>/<name>    a relative symlink to ../../blobs/<hash>
      refs/<revision>              the commit a branch or tag resolved to

transformers, `hf` and our own loader (service.models.sources) read this
layout; the pull writes it. Every path here is made from parts that
service.hub.trust checked, and each one is checked again, resolved, to lie
inside the cache before anything is created: whatever the hub sent, nothing
is written outside it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import uuid
from pathlib import Path
from typing import BinaryIO

import structlog
from huggingface_hub.file_download import repo_folder_name

from service.errors import AccessDenied
from service.hub.trust import Digest, Hasher

log = structlog.get_logger("hub")

PARTIAL_SUFFIX = ".incomplete"
# Files are hashed this much at a time.
_READ_BLOCK = 1 << 20


class OutsideCache(AccessDenied):
    """A path the cache would use resolves outside it (a planted symbolic link)."""

    def __init__(self, path: str, root: str) -> None:
        super().__init__(
            f"{path} in the hub cache leads outside it (to {os.path.realpath(path)}): this "
            f"server writes and deletes only inside {root}. Replace the link with a folder, "
            "or point --hf-cache-dir at the folder it leads to"
        )
        self.path = path


class RepoCache:
    def __init__(self, cache_dir: Path, repo_id: str) -> None:
        self.root = os.path.realpath(cache_dir)
        self.folder = os.path.join(self.root, repo_folder_name(repo_id=repo_id, repo_type="model"))

    def blob(self, digest: Digest) -> str:
        return os.path.join(self.folder, "blobs", digest.hex)

    def partial(self, digest: Digest) -> str:
        return self.blob(digest) + PARTIAL_SUFFIX

    def lock(self, digest: Digest) -> str:
        """Where huggingface_hub locks a blob while it writes it: taking the same lock
        keeps this server, another one and `hf download` off each other's files."""
        return os.path.join(
            self.root, ".locks", os.path.basename(self.folder), f"{digest.hex}.lock"
        )

    def snapshot_file(self, commit: str, name: str) -> str:
        return os.path.join(self.folder, "snapshots", commit, name)

    def prepare(self) -> None:
        """blobs/ and snapshots/: a folder with both is one the cache scanner lists,
        interrupted pulls included."""
        for folder in ("blobs", "snapshots"):
            self.make_parent(os.path.join(self.folder, folder, "-"))

    def make_parent(self, path: str) -> None:
        """Create `path`'s folder, refusing one that resolves outside the cache."""
        parent = os.path.dirname(path)
        self.check_inside(parent)
        os.makedirs(parent, exist_ok=True)
        self.check_inside(parent)  # a link planted between the check and the creation

    def check_inside(self, path: str) -> None:
        real = os.path.realpath(path)
        if real != self.root and not real.startswith(self.root + os.sep):
            raise OutsideCache(path, self.root)

    def link(self, commit: str, name: str, digest: Digest) -> None:
        """snapshots/<commit>/<name> -> the blob, replaced atomically if it was there."""
        path = self.snapshot_file(commit, name)
        self.make_parent(path)
        target = os.path.relpath(self.blob(digest), os.path.dirname(path))
        temporary = f"{path}.{uuid.uuid4().hex}.link"
        os.symlink(target, temporary)
        try:
            os.replace(temporary, path)
        except OSError:
            os.unlink(temporary)
            raise

    def unlink(self, commit: str, name: str) -> None:
        remove(self.snapshot_file(commit, name))

    def linked_blob(self, commit: str, name: str) -> str | None:
        """The blob a snapshot entry links to, if it is a link into this repo's blobs."""
        path = self.snapshot_file(commit, name)
        if not os.path.islink(path):
            return None
        real = os.path.realpath(path)
        blobs = os.path.join(self.folder, "blobs") + os.sep
        return real if real.startswith(blobs) else None

    def write_ref(self, revision: str, commit: str) -> None:
        """refs/<revision> holds the commit, so the revision's name finds the snapshot."""
        path = os.path.join(self.folder, "refs", revision)
        self.make_parent(path)
        temporary = f"{path}.{uuid.uuid4().hex}.ref"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        with os.fdopen(os.open(temporary, flags, 0o644), "w") as file:
            file.write(commit)
        os.replace(temporary, path)  # replaces a link planted there, never its target


def planted(path: str) -> str | None:
    """What makes an entry the cache would write through not its own: a symbolic
    link, something other than a file, a file with other names. None if it is fine
    (or absent)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(info.st_mode):
        return "a symbolic link"
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file"
    if info.st_nlink != 1:
        return f"a file with {info.st_nlink} names (a hard link)"
    return None


def drop_planted(path: str) -> None:
    """Remove what `planted` found at `path` (the link itself, never what it leads to)."""
    why = planted(path)
    if why is None:
        return
    if why == "not a regular file":
        raise AccessDenied(
            f"{path} in the hub cache is not a regular file: this server will not write "
            "through it; remove it"
        )
    remove(path)
    log.warning("removed a link planted in the hub cache", path=path, was=why)


def open_partial(path: str) -> BinaryIO:
    """A partial file to write, the cache's own: created, or one an earlier pull left.
    A link planted in its place is removed and the file started afresh; one planted
    between the check and the opening is refused."""
    drop_planted(path)
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        descriptor = os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise AccessDenied(f"{path} in the hub cache became a link: not written") from exc
        raise
    info = os.fstat(descriptor)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(descriptor)
        raise AccessDenied(f"{path} in the hub cache gained another name: not written")
    return os.fdopen(descriptor, "r+b")


def file_size(path: str) -> int | None:
    """The size of a file the cache may use as its own (not a link); None otherwise."""
    if planted(path) is not None:
        return None
    try:
        return os.lstat(path).st_size
    except FileNotFoundError:
        return None


def hash_file(path: str, hasher: Hasher, limit: int | None = None) -> int:
    """Feed a file's bytes (its first `limit`) to `hasher`; the count fed. A link is
    not followed (OSError)."""
    fed = 0
    with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "rb") as file:
        while limit is None or fed < limit:
            want = _READ_BLOCK if limit is None else min(_READ_BLOCK, limit - fed)
            block = file.read(want)
            if not block:
                break
            hasher.update(block)
            fed += len(block)
    return fed


def verified(path: str, size: int, digest: Digest) -> bool:
    """Whether a file (not a link to one) holds exactly the `size` bytes that hash to
    `digest`."""
    try:
        info = os.lstat(path)
        if not stat.S_ISREG(info.st_mode) or info.st_size != size:
            return False
        hasher = digest.hasher(size)
        hash_file(path, hasher)
    except OSError:
        return False
    return hasher.hexdigest() == digest.hex


def remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
