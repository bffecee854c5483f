"""One repo's folder in the hub cache, in huggingface_hub's layout, written only by us.

    models--owner--name/
      blobs/<hash>                 a whole, verified file, named by its content hash
      blobs/<hash>.incomplete      a transfer under way or interrupted (never served)
      snapshots/<commit>/<name>    a relative symlink to ../../blobs/<hash>
      refs/<revision>              the commit a branch or tag resolved to

transformers, `hf` and our own loader (service.models.sources) read this
layout; the pull writes it. Every name here is made from parts that
service.hub.trust checked, and every folder is opened from the cache's root
through directory descriptors (service.hub.dirfd), one step at a time and
never through a link, for writes, renames and deletions alike: a link planted
or swapped in anywhere on the way is refused, so whatever the hub sent and
whatever another account did meanwhile, nothing is written outside the cache.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import stat
import uuid
from collections.abc import Iterator
from typing import BinaryIO

import structlog
from huggingface_hub.file_download import repo_folder_name

from service.errors import AccessDenied, NotSupported, excerpt
from service.hub import dirfd
from service.hub.dirfd import OutsideCache
from service.hub.trust import Digest, Hasher

log = structlog.get_logger("hub")

__all__ = ["OutsideCache", "RepoCache"]

PARTIAL_SUFFIX = ".incomplete"
# Files are hashed this much at a time.
_READ_BLOCK = 1 << 20
COMMIT = re.compile(r"[0-9a-f]{40}")


class RepoCache:
    def __init__(self, cache_dir: os.PathLike[str] | str, repo_id: str) -> None:
        self.root = os.path.realpath(cache_dir)
        self.name = repo_folder_name(repo_id=repo_id, repo_type="model")
        # Paths for messages and for matching loaded models; never opened by name.
        self.folder = os.path.join(self.root, self.name)

    # --- folders -----------------------------------------------------------------------

    @contextlib.contextmanager
    def at(self, *parts: str, create: bool = False) -> Iterator[int]:
        """The folder `parts` of the repo's folder, walked from the cache's root."""
        with self.at_root(self.name, *parts, create=create) as fd:
            yield fd

    @contextlib.contextmanager
    def at_root(self, *parts: str, create: bool = False) -> Iterator[int]:
        """The folder `parts` of the cache's root, walked without following a link."""
        with (
            dirfd.opened(dirfd.open_root(self.root, create=create)) as root,
            dirfd.folder(root, parts, create=create, label=self.root) as fd,
        ):
            yield fd

    def path(self, *parts: str) -> str:
        return os.path.join(self.folder, *parts)

    def prepare(self) -> None:
        """blobs/ and snapshots/: a folder with both is one the cache scanner lists,
        interrupted pulls included."""
        for folder in ("blobs", "snapshots"):
            with self.at(folder, create=True):
                pass

    def lock(self, digest: Digest) -> int:
        """The file huggingface_hub locks (flock) while it writes a blob, opened to lock:
        taking the same lock keeps this server, another one and `hf download` off each
        other's files. A link planted in its place is removed as a link."""
        name = f"{digest.hex}.lock"
        with self.at_root(".locks", self.name, create=True) as fd:
            label = os.path.join(self.root, ".locks", self.name, name)
            if dirfd.is_link(fd, name):
                dirfd.unlink(fd, name)
                log.warning("removed a link planted in the hub cache", path=label)
            return dirfd.open_file(fd, name, os.O_RDWR | os.O_CREAT, label=label)

    # --- blobs -------------------------------------------------------------------------

    def verified(self, digest: Digest, size: int) -> bool:
        """Whether blobs/<hash> is a file (not a link) of `size` bytes hashing to `digest`."""
        try:
            with self.at("blobs") as fd:
                return verified_at(fd, digest.hex, size, digest)
        except (FileNotFoundError, NotADirectoryError):
            return False

    def has_blob(self, digest: Digest) -> bool:
        try:
            with self.at("blobs") as fd:
                return dirfd.entry(fd, digest.hex) is not None
        except (FileNotFoundError, NotADirectoryError):
            return False

    def remove_blob(self, digest: Digest) -> None:
        with contextlib.suppress(FileNotFoundError), self.at("blobs") as fd:
            dirfd.unlink(fd, digest.hex)

    def partial_size(self, digest: Digest) -> int | None:
        """The bytes of blobs/<hash>.incomplete, if it is a file of the cache's own."""
        try:
            with self.at("blobs") as fd:
                name = digest.hex + PARTIAL_SUFFIX
                if planted(fd, name) is not None:
                    return None
                info = dirfd.entry(fd, name)
                return None if info is None else info.st_size
        except (FileNotFoundError, NotADirectoryError):
            return None

    def drop_planted_partial(self, digest: Digest) -> None:
        with self.at("blobs") as fd:
            name = digest.hex + PARTIAL_SUFFIX
            drop_planted(fd, name, self.path("blobs", name))

    def remove_partial(self, digest: Digest) -> None:
        with contextlib.suppress(FileNotFoundError), self.at("blobs") as fd:
            dirfd.unlink(fd, digest.hex + PARTIAL_SUFFIX)

    def open_partial(self, digest: Digest) -> BinaryIO:
        """The partial file to write, the cache's own: created, or one an earlier pull
        left. A link planted in its place is removed and the file started afresh; one
        planted between the check and the opening is refused. blobs/ must exist (a
        repo deleted under the pull is not made again here)."""
        name = digest.hex + PARTIAL_SUFFIX
        label = self.path("blobs", name)
        with self.at("blobs") as fd:
            drop_planted(fd, name, label)
            try:
                descriptor = dirfd.open_file(fd, name, os.O_RDWR | os.O_CREAT, label=label)
            except AccessDenied:
                raise AccessDenied(f"{label} in the hub cache became a link: not written") from None
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            os.close(descriptor)
            raise AccessDenied(f"{label} in the hub cache gained another name: not written")
        return os.fdopen(descriptor, "r+b")

    def hash_partial(self, digest: Digest, hasher: Hasher, limit: int | None = None) -> int:
        with self.at("blobs") as fd:
            return hash_at(fd, digest.hex + PARTIAL_SUFFIX, hasher, limit)

    def complete(self, digest: Digest) -> None:
        """The verified partial file becomes blobs/<hash>, atomically."""
        with self.at("blobs") as fd:
            os.rename(digest.hex + PARTIAL_SUFFIX, digest.hex, src_dir_fd=fd, dst_dir_fd=fd)

    # --- snapshots and refs ------------------------------------------------------------

    def link(self, commit: str, name: str, digest: Digest) -> None:
        """snapshots/<commit>/<name> -> the blob, replaced atomically if it was there."""
        *folders, base = dirfd.parts_of(name)
        parts = ["snapshots", commit, *folders]
        target = "../" * len(parts) + f"blobs/{digest.hex}"
        temporary = f"{base}.{uuid.uuid4().hex}.link"
        with self.at(*parts, create=True) as fd:
            os.symlink(target, temporary, dir_fd=fd)
            try:
                os.rename(temporary, base, src_dir_fd=fd, dst_dir_fd=fd)
            except OSError:
                dirfd.unlink(fd, temporary)
                raise

    def unlink(self, commit: str, name: str) -> None:
        *folders, base = dirfd.parts_of(name)
        with (
            contextlib.suppress(FileNotFoundError, NotADirectoryError),
            self.at("snapshots", commit, *folders) as fd,
        ):
            dirfd.unlink(fd, base)

    def linked_blob(self, commit: str, name: str) -> str | None:
        """The blob a snapshot entry links to (its name in blobs/), if it is a link as the
        cache makes them: relative, up to the repo's folder, then one entry of blobs/."""
        *folders, base = dirfd.parts_of(name)
        parts = ["snapshots", commit, *folders]
        try:
            with self.at(*parts) as fd:
                return blob_named(dirfd.read_link(fd, base), len(parts))
        except (FileNotFoundError, NotADirectoryError):
            return None

    def write_ref(self, revision: str, commit: str) -> None:
        """refs/<revision> holds the commit, so the revision's name finds the snapshot."""
        *folders, base = dirfd.parts_of(revision)
        temporary = f"{base}.{uuid.uuid4().hex}.ref"
        with self.at("refs", *folders, create=True) as fd:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
            label = self.path("refs", revision)
            with os.fdopen(dirfd.open_file(fd, temporary, flags, label=label), "w") as file:
                file.write(commit)
            # Replaces a link planted there, never its target.
            os.rename(temporary, base, src_dir_fd=fd, dst_dir_fd=fd)

    def read_ref(self, revision: str) -> str | None:
        """The commit refs/<revision> holds; None if there is no such ref. A ref that
        holds anything but a commit id (a path, say) is refused, never followed."""
        *folders, base = dirfd.parts_of(revision)
        try:
            with self.at("refs", *folders) as fd:
                return ref_commit(fd, base, self.path("refs", revision))
        except (FileNotFoundError, NotADirectoryError):
            return None


def blob_named(target: str | None, depth: int) -> str | None:
    """The entry of blobs/ a snapshot link's own text names, for a link `depth` folders
    below the repo's folder; None for any other text (absolute, elsewhere, deeper)."""
    prefix = "../" * depth + "blobs/"
    if target is None or not target.startswith(prefix):
        return None
    name = target[len(prefix) :]
    return name if name not in ("", ".", "..") and "/" not in name else None


def ref_commit(fd: int, name: str, label: str) -> str | None:
    """The commit id a ref file holds (None if absent); NotSupported for other text."""
    try:
        descriptor = dirfd.open_file(fd, name, os.O_RDONLY, label=label)
    except FileNotFoundError:
        return None
    except AccessDenied:
        raise NotSupported(
            f"{label} in the hub cache is a link, not a ref file: this server will not "
            "follow it; remove it, or pull the revision again"
        ) from None
    with os.fdopen(descriptor, "rb") as file:
        text = file.read(128)
    commit = text.decode("ascii", "replace").strip()
    if COMMIT.fullmatch(commit) is None:
        raise NotSupported(
            f"{label} in the hub cache holds {excerpt(commit)}, not a commit id (40 hex "
            "digits): this server will not follow it; remove it, or pull the revision again"
        )
    return commit


def planted(fd: int, name: str) -> str | None:
    """What makes an entry the cache would write through not its own: a symbolic
    link, something other than a file, a file with other names. None if it is fine
    (or absent)."""
    info = dirfd.entry(fd, name)
    if info is None:
        return None
    if stat.S_ISLNK(info.st_mode):
        return "a symbolic link"
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file"
    if info.st_nlink != 1:
        return f"a file with {info.st_nlink} names (a hard link)"
    return None


def drop_planted(fd: int, name: str, label: str) -> None:
    """Remove what `planted` found (the link itself, never what it leads to)."""
    why = planted(fd, name)
    if why is None:
        return
    if why == "not a regular file":
        raise AccessDenied(
            f"{label} in the hub cache is not a regular file: this server will not write "
            "through it; remove it"
        )
    dirfd.unlink(fd, name)
    log.warning("removed a link planted in the hub cache", path=label, was=why)


def hash_at(fd: int, name: str, hasher: Hasher, limit: int | None = None) -> int:
    """Feed a file's bytes (its first `limit`) to `hasher`; the count fed. A link is
    not followed (OSError)."""
    fed = 0
    descriptor = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
    with os.fdopen(descriptor, "rb") as file:
        while limit is None or fed < limit:
            want = _READ_BLOCK if limit is None else min(_READ_BLOCK, limit - fed)
            block = file.read(want)
            if not block:
                break
            hasher.update(block)
            fed += len(block)
    return fed


def verified_at(fd: int, name: str, size: int, digest: Digest) -> bool:
    """Whether an entry (not a link) is a file of exactly the `size` bytes that hash
    to `digest`."""
    try:
        info = dirfd.entry(fd, name)
        if info is None or not stat.S_ISREG(info.st_mode) or info.st_size != size:
            return False
        hasher = digest.hasher(size)
        hash_at(fd, name, hasher)
    except OSError:
        return False
    return hasher.hexdigest() == digest.hex


def take_lock(descriptor: int) -> bool:
    """An exclusive flock on an open lock file, if it is free now."""
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
            return False
        raise
    return True
