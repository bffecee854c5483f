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
import os
import uuid
from pathlib import Path

from huggingface_hub.file_download import repo_folder_name

from service.hub.trust import Digest, Hasher

PARTIAL_SUFFIX = ".incomplete"
# Files are hashed this much at a time.
_READ_BLOCK = 1 << 20


class OutsideCache(Exception):
    """A path the cache would create resolves outside it (a planted symlink)."""


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
            raise OutsideCache(path)

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
        with open(temporary, "w") as file:
            file.write(commit)
        os.replace(temporary, path)


def hash_file(path: str, hasher: Hasher, limit: int | None = None) -> int:
    """Feed a file's bytes (its first `limit`) to `hasher`; the count fed."""
    fed = 0
    with open(path, "rb") as file:
        while limit is None or fed < limit:
            want = _READ_BLOCK if limit is None else min(_READ_BLOCK, limit - fed)
            block = file.read(want)
            if not block:
                break
            hasher.update(block)
            fed += len(block)
    return fed


def verified(path: str, size: int, digest: Digest) -> bool:
    """Whether a file holds exactly the `size` bytes that hash to `digest`."""
    try:
        if os.path.getsize(path) != size:
            return False
        hasher = digest.hasher(size)
        hash_file(path, hasher)
    except OSError:
        return False
    return hasher.hexdigest() == digest.hex


def remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
