"""A hub repo's metadata over HTTP: its files and sizes, configs and headers, never its weights.

Everything goes through huggingface_hub: `model_info` for the file list (with
sizes) and the commit a revision resolves to, and `HfFileSystem` for reads,
which fetch byte ranges, so reading a GGUF's header moves the header (the key
values, the tokenizer among them, and the tensor table) and a safetensors
header its first bytes. What the hub says no to becomes the service's error:
an unknown repo or revision NOT_FOUND, a gated one without a token that may
read it PERMISSION_DENIED, a hub that cannot be reached UNAVAILABLE.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, BinaryIO, cast
from urllib.parse import quote

import httpx2
from huggingface_hub import HfApi, HfFileSystem
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from service.errors import AccessDenied, ModelNotFound, Unavailable, excerpt
from service.hub.trust import Digest, check_commit, check_file_name, file_digest
from service.model_source import HubReference

# Reads of a remote file fetch this much at a time: a GGUF header is read in a few.
READ_BLOCK = 1 << 20


@dataclass(frozen=True)
class HubAccess:
    """Where the hub is and how to ask it (the operator's settings)."""

    endpoint: str
    token: str | None = field(default=None, repr=False)
    timeout: float = 10.0


class RemoteRepo:
    """One revision of a hub repo, resolved to its commit, read without downloading it."""

    def __init__(self, hub: HubReference, access: HubAccess) -> None:
        self.hub = hub
        self._access = access
        with hub_errors(hub):
            api = HfApi(endpoint=access.endpoint, token=access.token or False)
            info = api.model_info(
                hub.repo_id, revision=hub.revision, files_metadata=True, timeout=access.timeout
            )
        if not info.sha:
            raise Unavailable(f"the hub gave no commit for {excerpt(str(hub))}")
        # Names, hashes and the commit become paths in the cache: checked here, once.
        self.commit: str = check_commit(hub.repo_id, info.sha)
        self.sizes: dict[str, int] = {}
        self.digests: dict[str, Digest] = {}
        for sibling in info.siblings or []:
            name = check_file_name(hub.repo_id, sibling.rfilename)
            self.sizes[name] = _size(hub.repo_id, name, sibling.size)
            lfs = sibling.lfs
            sha256 = lfs.get("sha256") if isinstance(lfs, dict) else getattr(lfs, "sha256", None)
            self.digests[name] = file_digest(hub.repo_id, name, sha256, sibling.blob_id)
        self._files = HfFileSystem(
            endpoint=access.endpoint, token=access.token or False, skip_instance_cache=True
        )

    @contextmanager
    def open(self, name: str, block: int = READ_BLOCK) -> Iterator[BinaryIO]:
        """A file of this commit, fetched forward `block` bytes at a time as it is read.

        What was fetched is kept, so seeking back costs nothing and each byte up to
        the furthest one read crosses the network once: a GGUF header's reader peeks
        and steps back, which fsspec's own read-ahead cache would fetch again."""
        path = f"{self.hub.repo_id}@{quote(self.commit, safe='')}/{name}"
        with hub_errors(self.hub):
            remote = self._files.open(path, "rb", cache_type="none")
            try:

                def fetch(start: int, end: int) -> bytes:
                    remote.seek(start)
                    return bytes(remote.read(end - start))

                yield cast(BinaryIO, _FetchedForward(fetch, self.sizes[name], block))
            finally:
                remote.close()

    def read_small(self, name: str, limit: int) -> bytes | None:
        """A whole file of at most `limit` bytes (a config); None, unread, if larger."""
        size = self.sizes[name]
        if size > limit:
            return None
        with self.open(name) as remote:
            return remote.read(size)


def _size(repo: str, name: str, size: object) -> int:
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise Unavailable(
            f"the hub listed {excerpt(name)} of {excerpt(repo)} without a usable size "
            f"({excerpt(repr(size))})"
        )
    return size


@contextmanager
def hub_errors(hub: HubReference) -> Iterator[None]:
    """The hub's refusals and failures as the service's errors, with what to do."""
    label = excerpt(str(hub))
    try:
        yield
    except GatedRepoError as exc:  # before RepositoryNotFoundError: it is one
        raise AccessDenied(
            f"{label} is gated on the Hugging Face hub: accept its terms there, and give the "
            "server a token that may read it (--hf-token or HF_TOKEN)"
        ) from exc
    except RevisionNotFoundError as exc:
        raise ModelNotFound(
            f"the Hugging Face hub has no revision {hub.revision!r} of {label}"
        ) from exc
    except RepositoryNotFoundError as exc:
        raise ModelNotFound(
            f"the Hugging Face hub has no model {excerpt(hub.repo_id)} (a private one needs "
            "the server to have a token that may read it: --hf-token or HF_TOKEN)"
        ) from exc
    except HfHubHTTPError as exc:
        raise refusal_of(exc.response.status_code if exc.response is not None else 0, label) or (
            Unavailable(f"the Hugging Face hub could not answer for {label}: {exc}")
        ) from exc
    except (httpx2.HTTPError, OSError) as exc:  # OSError: fsspec's, for a read that failed
        raise Unavailable(f"the Hugging Face hub could not answer for {label}: {exc}") from exc


def refusal_of(status: int, label: str) -> AccessDenied | None:
    """A refusal a retry will not change: 401 and 403 are the hub saying no."""
    if status in (401, 403):
        return AccessDenied(
            f"the Hugging Face hub refused access to {label} (HTTP {status}): give the "
            "server a token that may read it (--hf-token or HF_TOKEN)"
        )
    return None


class _FetchedForward(io.RawIOBase):
    """A file read through `fetch(start, end)`, `block` bytes at a time, kept as read."""

    def __init__(self, fetch: Callable[[int, int], bytes], size: int, block: int) -> None:
        self._fetch = fetch
        self._size = size
        self._block = block
        self._data = bytearray()
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._size}[whence]
        self._position = max(0, base + offset)
        return self._position

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        end = min(self._position + len(view), self._size)
        while len(self._data) < end:
            start = len(self._data)
            self._data += self._fetch(start, min(start + self._block, self._size))
        count = max(0, end - self._position)
        view[:count] = self._data[self._position : end]
        self._position += count
        return count
