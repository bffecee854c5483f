"""What the hub says, checked before it names a file, a folder or a hash on this server.

The hub is a remote party: a mirror or proxy named by HF_ENDPOINT may be
compromised, and a broken one may send anything. Every value that ends up in a
path under the hub cache (a commit, a file name, a content hash, a revision)
is checked here first, and refused with INVALID_ARGUMENT naming the hub as
the cause. Nothing the hub sends is joined onto a path unchecked.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Literal, Protocol

from service.errors import InvalidRequest, excerpt

_COMMIT = re.compile(r"[0-9a-f]{40}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
# A file name in a repo: no control characters, no backslash (a separator elsewhere).
_NAME_CHARACTERS = re.compile(r"[^\x00-\x1f\x7f\\]+")
# Longest name and longest part of one that the cache will create (Linux's NAME_MAX).
MAX_PATH_LENGTH = 1024
MAX_PART_LENGTH = 255
# Suffixes the cache gives its own files: a repo file must not look like one.
_RESERVED_SUFFIXES = (".incomplete", ".lock")


class Hasher(Protocol):
    def update(self, data: bytes, /) -> None: ...

    def hexdigest(self) -> str: ...


@dataclass(frozen=True)
class Digest:
    """What a file's bytes hash to: an LFS file's sha256, or a small file's git blob id.

    The hub cache stores each file under this hash (blobs/<hex>), so it is both
    the file's identity and, once checked, a safe name."""

    algorithm: Literal["sha256", "git-sha1"]
    hex: str

    def hasher(self, size: int) -> Hasher:
        """A hash that, fed the file's `size` bytes, gives `hex` if they are the right ones."""
        if self.algorithm == "sha256":
            return hashlib.sha256()
        # git hashes a blob with its header: "blob <size>\\0".
        return hashlib.sha1(b"blob %d\0" % size, usedforsecurity=False)


def file_digest(repo: str, name: str, sha256: str | None, blob_id: str | None) -> Digest:
    """A listed file's digest: its LFS sha256 where it has one, else its git blob id."""
    if sha256 is not None:
        return Digest("sha256", _hex(repo, sha256, _SHA256, f"the sha256 of {excerpt(name)}"))
    if blob_id is not None:
        return Digest("git-sha1", _hex(repo, blob_id, _COMMIT, f"the blob id of {excerpt(name)}"))
    raise InvalidRequest(
        f"the hub listed {excerpt(name)} of {excerpt(repo)} without a hash to check it by"
    )


def check_commit(repo: str, commit: str) -> str:
    """A commit the hub resolved a revision to: 40 lowercase hex digits."""
    return _hex(repo, commit, _COMMIT, "the commit")


def check_file_name(repo: str, name: str) -> str:
    """A file of the repo, as a relative path that stays inside the repo's folder."""
    parts = name.split("/")
    safe = (
        0 < len(name) <= MAX_PATH_LENGTH
        and _NAME_CHARACTERS.fullmatch(name) is not None
        and all(part not in ("", ".", "..") and len(part) <= MAX_PART_LENGTH for part in parts)
        and not name.endswith(_RESERVED_SUFFIXES)
    )
    if not safe:
        raise InvalidRequest(
            f"the hub listed a file named {excerpt(name)} in {excerpt(repo)}: not a path "
            "inside the repo (it is absolute, climbs out with '..', or holds control "
            "characters); this server will not write it. Check --hf-endpoint"
        )
    return name


def check_revision(repo: str, revision: str) -> str:
    """A branch or tag name, stored as refs/<revision> in the repo's folder."""
    try:
        return check_file_name(repo, revision)
    except InvalidRequest:
        raise InvalidRequest(
            f"{excerpt(revision)} is not a revision of {excerpt(repo)} this server can "
            "store: name a branch, a tag or a commit"
        ) from None


def etag_hex(value: str) -> str:
    """An ETag header's value without its quotes and weak marker."""
    return value.strip().removeprefix("W/").strip('"')


def check_etag(repo: str, name: str, value: str) -> str:
    """The hub's ETag for a file: the git blob id or sha256 it stores it under."""
    text = etag_hex(value).lower()
    if _COMMIT.fullmatch(text) is None and _SHA256.fullmatch(text) is None:
        raise InvalidRequest(
            f"the hub sent {excerpt(value)} as the ETag of {excerpt(name)} in {excerpt(repo)}: "
            "not a git or LFS hash; this server will not use it. Check --hf-endpoint"
        )
    return text


def _hex(repo: str, value: str, pattern: re.Pattern[str], what: str) -> str:
    if pattern.fullmatch(value) is None:
        raise InvalidRequest(
            f"the hub sent {excerpt(value)} as {what} of {excerpt(repo)}: not a hash of the "
            "expected form; this server will not use it. Check --hf-endpoint"
        )
    return value
