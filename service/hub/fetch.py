"""Fetching one file of a hub repo into the cache: resumed, bounded, verified.

huggingface_hub's own download names the file after the ETag the server
sends, unchecked, and deletes a partial file when a transfer fails; neither
is acceptable for a remote party we do not trust. So the bytes are fetched
here, over the same HTTP API (`/{repo}/resolve/{commit}/{file}`, following
the hub's redirect to its CDN without the token, by service.hub.client's
rules), into the cache's own
layout (service.hub.cache):

- the file lands in `blobs/<hash>.incomplete`, named by the hash the repo's
  listing gave (checked by service.hub.trust), never by a response header;
- a partial file left by an earlier attempt is continued with a ranged request
  (the partial's name is the content hash, and the hub's ETag for the file is
  checked against it: a file that changed on the hub is fetched afresh);
- no more bytes than the listed size are written, and a body that ends short
  is resumed, a few times, then left for the next pull;
- the file is hashed as it is written (sha256 for LFS files, the git blob id
  for small ones; the bytes kept from an earlier attempt are hashed from the
  disk), and only a match moves it, atomically, to `blobs/<hash>` and links it
  into the snapshot: a mismatch deletes it and is DATA_LOSS;
- every file is opened, renamed and linked through the folders' descriptors
  (service.hub.cache, service.hub.dirfd): a folder swapped for a link while the
  body arrives makes the next step PERMISSION_DENIED, never a write outside.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import BinaryIO
from urllib.parse import quote

import httpx2

from service.errors import DataLoss, ModelNotFound, Unavailable, excerpt
from service.hub.cache import RepoCache, take_lock
from service.hub.client import HubClient, refusal_of
from service.hub.disk import NO_ROOM, disk_full
from service.hub.trust import Digest, Hasher, check_etag

# Attempts at one file within one pull, and the pause before each retry.
ATTEMPTS = 4
_BACKOFF = (0.5, 1.0, 2.0)
# How often a pull waiting for another's lock on a file tries it again (and looks
# whether it is still wanted).
_LOCK_POLL_STEP = 0.05
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+)")


class Cancelled(Exception):
    """Every caller of the pull went away: it stops at the next chunk, keeping its bytes."""


class _Retry(Exception):
    """This attempt failed in a way another may not (a dropped connection, a 5xx)."""


@dataclass(frozen=True)
class HubFile:
    name: str
    size: int
    digest: Digest


@dataclass
class FileFetch:
    """Fetches files of one commit of one repo into the cache."""

    client: HubClient
    cache: RepoCache
    repo_id: str
    commit: str
    # Called with each count of bytes written, from the fetching thread.
    on_bytes: Callable[[int], None]
    cancelled: threading.Event

    def fetch(self, file: HubFile) -> None:
        """Fetch, verify and link one file; its partial is kept if this fails midway."""
        with self._locked(file.digest):
            if self.cache.verified(file.digest, file.size):
                self.cache.link(self.commit, file.name, file.digest)  # fetched meanwhile
                return
            self._fetch(file)

    @contextmanager
    def _locked(self, digest: Digest) -> Iterator[None]:
        """The blob's lock, waited for while the pull still has a caller. The lock file
        is opened through the cache's folders (huggingface_hub's filelock would open it
        by path) and locked with flock, as filelock locks it."""
        descriptor = self.cache.lock(digest)
        try:
            while not take_lock(descriptor):
                if self.cancelled.is_set():
                    raise Cancelled()
                time.sleep(_LOCK_POLL_STEP)
            yield  # the lock goes with the descriptor
        finally:
            os.close(descriptor)

    def _fetch(self, file: HubFile) -> None:
        with self.cache.at("blobs", create=True):
            pass
        failure: Exception | None = None
        for attempt in range(ATTEMPTS):
            if attempt:
                time.sleep(_BACKOFF[min(attempt - 1, len(_BACKOFF) - 1)])
            try:
                hasher = self._attempt(file)
                break
            except _Retry as exc:
                failure = exc
        else:
            raise Unavailable(
                f"the Hugging Face hub did not send {excerpt(file.name)} of "
                f"{excerpt(self.repo_id)} whole after {ATTEMPTS} attempts ({failure}); what "
                "arrived is kept, and the next pull continues from there"
            )
        self._finish(file, hasher)

    def _attempt(self, file: HubFile) -> Hasher:
        """One request for what the partial file lacks; the hash of the whole file."""
        have = self._partial_size(file)
        hasher = file.digest.hasher(file.size)
        if have == file.size:
            self.cache.hash_partial(file.digest, hasher)
            return hasher
        with self._response(file, have) as (response, start):
            if start:  # the bytes kept from before are hashed from the disk, once
                self.cache.hash_partial(file.digest, hasher, limit=start)
            self._receive(file, response, start, hasher)
        return hasher

    def _partial_size(self, file: HubFile) -> int:
        """Bytes an earlier attempt left, or 0 (a partial longer than the file is dropped,
        and so is a link planted in its place: removed as a link, nothing followed)."""
        self.cache.drop_planted_partial(file.digest)
        have = self.cache.partial_size(file.digest) or 0
        if have > file.size:
            self.cache.remove_partial(file.digest)
            return 0
        return have

    def _finish(self, file: HubFile, hasher: Hasher) -> None:
        """The hash of what was written decides: into place, or deleted."""
        if hasher.hexdigest() != file.digest.hex:
            self.cache.remove_partial(file.digest)
            raise DataLoss(
                f"{excerpt(file.name)} of {excerpt(self.repo_id)} arrived with the listed size "
                f"but its {file.digest.algorithm} is {hasher.hexdigest()[:16]}..., not the "
                f"{file.digest.hex[:16]}... the hub lists: the copy was deleted; pull again, "
                "and check --hf-endpoint if it happens again"
            )
        self.cache.complete(file.digest)
        self.cache.link(self.commit, file.name, file.digest)

    # --- one request -----------------------------------------------------------------

    @contextmanager
    def _response(self, file: HubFile, have: int) -> Iterator[tuple[httpx2.Response, int]]:
        """The file's body from byte `have` (or from 0, if the server ignores the range)."""
        url = self.client.url(f"{quote(self.repo_id)}/resolve/{self.commit}/{quote(file.name)}")
        headers = {"Range": f"bytes={have}-"} if have else {}
        try:
            with self.client.get(
                url, headers, on_hub_answer=lambda answer: self._check_hub_headers(file, answer)
            ) as response:
                self._check_status(file, response)
                yield response, self._start_of(file, response, have)
        except httpx2.TransportError as exc:
            raise _Retry(f"{type(exc).__name__}: {exc}") from exc

    def _check_hub_headers(self, file: HubFile, response: httpx2.Response) -> None:
        """The hub's word on which file this is, before any of its bytes are kept."""
        etag = response.headers.get("X-Linked-Etag") or response.headers.get("ETag")
        if response.status_code >= 400 or not etag:
            etag = None  # an error page's ETag names no file
        if etag is not None and check_etag(self.repo_id, file.name, etag) != file.digest.hex:
            raise Unavailable(
                f"{excerpt(file.name)} of {excerpt(self.repo_id)} changed on the hub "
                f"since it was listed (its ETag is {excerpt(etag)}): pull again"
            )
        linked_size = response.headers.get("X-Linked-Size")
        if linked_size is not None and linked_size.strip() != str(file.size):
            raise DataLoss(
                f"the hub lists {excerpt(file.name)} of {excerpt(self.repo_id)} at {file.size} "
                f"bytes but serves it as {excerpt(linked_size)}: not fetched. Check --hf-endpoint"
            )

    def _check_status(self, file: HubFile, response: httpx2.Response) -> None:
        status = response.status_code
        if status in (200, 206):
            return
        label = f"{excerpt(file.name)} of {excerpt(self.repo_id)}"
        refusal = refusal_of(status, label)
        if refusal is not None:
            raise refusal
        if status == 404:
            raise ModelNotFound(f"the hub no longer has {label} at commit {self.commit[:12]}")
        if status == 429 or status >= 500:
            raise _Retry(f"HTTP {status}")
        raise Unavailable(f"the Hugging Face hub answered HTTP {status} for {label}")

    def _start_of(self, file: HubFile, response: httpx2.Response, have: int) -> int:
        """Where the body starts in the file: `have` for a range, 0 for the whole file."""
        if response.status_code == 200:
            self._expect_length(file, response, file.size)
            return 0
        found = _CONTENT_RANGE.fullmatch(response.headers.get("Content-Range", "").strip())
        if found is None or int(found[1]) != have or int(found[3]) != file.size:
            raise DataLoss(
                f"the hub answered a resumed {excerpt(file.name)} with the range "
                f"{excerpt(response.headers.get('Content-Range', ''))}, not bytes {have}- of "
                f"{file.size}: not fetched. Check --hf-endpoint"
            )
        self._expect_length(file, response, file.size - have)
        return have

    def _expect_length(self, file: HubFile, response: httpx2.Response, length: int) -> None:
        given = response.headers.get("Content-Length")
        if given is not None and given.strip() != str(length):
            raise DataLoss(
                f"the hub lists {excerpt(file.name)} of {excerpt(self.repo_id)} at {file.size} "
                f"bytes, but its answer holds {excerpt(given)} where {length} were due: not "
                "fetched. Check --hf-endpoint"
            )

    # --- the body ----------------------------------------------------------------------

    def _receive(
        self, file: HubFile, response: httpx2.Response, start: int, hasher: Hasher
    ) -> None:
        """Write the body after the partial's first `start` bytes, no further than the size."""
        try:
            with self.cache.open_partial(file.digest) as out:
                out.seek(start)
                out.truncate()
                self._copy(file, response, out, start, hasher)
        except OSError as exc:
            if exc.errno in NO_ROOM:  # the disk is full for everyone: give the space back
                self.cache.remove_partial(file.digest)
                raise disk_full(self.cache.root, f"pulling {excerpt(file.name)}") from exc
            raise
        except httpx2.TransportError as exc:  # the body ended early: the bytes so far stay
            raise _Retry(f"{type(exc).__name__}: {exc}") from exc

    def _copy(
        self,
        file: HubFile,
        response: httpx2.Response,
        out: BinaryIO,
        start: int,
        hasher: Hasher,
    ) -> None:
        """The body into the file and the hash, as it arrives."""
        written = start
        # As the bytes arrive (not in fixed blocks): when the connection drops,
        # everything received is already on disk for the resume.
        for chunk in response.iter_bytes():
            if self.cancelled.is_set():
                raise Cancelled()
            if written + len(chunk) > file.size:
                out.close()
                self.cache.remove_partial(file.digest)
                raise DataLoss(
                    f"the hub sent more than the {file.size} bytes it lists for "
                    f"{excerpt(file.name)} of {excerpt(self.repo_id)}: the copy was deleted. "
                    "Check --hf-endpoint"
                )
            out.write(chunk)
            hasher.update(chunk)
            written += len(chunk)
            self.on_bytes(len(chunk))
        out.flush()
        if written < file.size:
            raise _Retry(f"the body ended at byte {written} of {file.size}")
