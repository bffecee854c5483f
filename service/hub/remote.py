"""A hub repo's metadata over HTTP: its files and sizes, configs and headers, never its weights.

The file list (with sizes and hashes) and the commit a revision resolves to
come from the hub API's model info (`/api/models/{repo}/revision/{rev}?blobs=true`,
the call huggingface_hub's `model_info` makes), read up to a bound. Files are
read by byte ranges of their `/resolve/{commit}/` URL (service.hub.ranged), so
reading a GGUF's header moves the parts of the header admission reads, and a
safetensors header its first bytes. Every byte counts against the admission's
budget (service.hub.budget), and every request goes through
service.hub.client, which checks redirects and binds the token to the hub.

What the hub says no to becomes the service's error: an unknown repo or
revision NOT_FOUND, a gated one without a token that may read it
PERMISSION_DENIED, a hub that cannot be reached, or answers garbled, UNAVAILABLE.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, BinaryIO, cast
from urllib.parse import quote

from service.errors import DataLoss, NotSupported, Unavailable, excerpt
from service.hub.budget import (
    LISTING_BYTES,
    LISTING_CONTAINERS,
    LISTING_ITEMS,
    ReadBudget,
    json_containers,
    json_items,
)
from service.hub.client import (
    HubClient,
    TooLarge,
    read_bounded,
    read_prefix,
    status_error,
    transport_errors,
)
from service.hub.ranged import RangedFile
from service.hub.trust import Digest, check_commit, check_file_name, file_digest
from service.model_source import HubReference

_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+)")


class RemoteRepo:
    """One revision of a hub repo, resolved to its commit, read without downloading it."""

    def __init__(self, hub: HubReference, client: HubClient, budget: ReadBudget) -> None:
        self.hub = hub
        self._client = client
        self.budget = budget
        self._label = excerpt(str(hub))
        self._urls: dict[str, str] = {}  # where a file's bytes were last served from
        info = self._model_info()
        # Names, hashes and the commit become paths in the cache: checked here, once.
        commit = _text(info.get("sha"))
        if not commit:
            raise Unavailable(f"the hub gave no commit for {self._label}")
        self.commit: str = check_commit(hub.repo_id, commit)
        self.sizes: dict[str, int] = {}
        self.digests: dict[str, Digest] = {}
        for sibling in _siblings(info, self._label):
            name = check_file_name(hub.repo_id, _text(sibling.get("rfilename")) or "")
            self.sizes[name] = _size(hub.repo_id, name, sibling.get("size"))
            lfs = sibling.get("lfs")
            sha256 = _text(lfs.get("sha256")) if isinstance(lfs, dict) else None
            blob_id = _text(sibling.get("blobId"))
            self.digests[name] = file_digest(hub.repo_id, name, sha256, blob_id)

    def _model_info(self) -> dict[str, Any]:
        """The hub's description of the revision, read up to LISTING_BYTES."""
        path = f"api/models/{self.hub.repo_id}"
        if self.hub.revision is not None:
            path += f"/revision/{quote(self.hub.revision, safe='')}"
        url = self._client.url(path) + "?blobs=true"  # sizes and hashes with the names
        with transport_errors(self._label), self._client.get(url) as answer:
            if answer.status_code != 200:
                raise status_error(answer, self._label)
            try:
                body = read_bounded(answer, LISTING_BYTES, self.budget.deadline)
            except TooLarge as exc:
                raise NotSupported(
                    f"the hub's file listing of {self._label} is {exc.args[0]} bytes or more; "
                    f"this server reads at most {LISTING_BYTES} (some 38,000 files). Download "
                    "the files you need yourself and serve them by path"
                ) from None
        self.budget.spend(len(body), f"the file listing of {self._label}")
        if json_containers(body) > LISTING_CONTAINERS:
            raise NotSupported(
                f"the hub's file listing of {self._label} holds more than "
                f"{LISTING_CONTAINERS} JSON objects and arrays (two a file); this server "
                "reads no more. Download the files you need yourself and serve them by path"
            )
        if json_items(body) > LISTING_ITEMS:
            raise NotSupported(
                f"the hub's file listing of {self._label} holds more than {LISTING_ITEMS} "
                "JSON values (seven a file); this server reads no more. Download the files "
                "you need yourself and serve them by path"
            )
        try:
            info = json.loads(body)
        except (ValueError, RecursionError):
            info = None
        if not isinstance(info, dict):
            raise Unavailable(f"the hub's listing of {self._label} is not a JSON object; retry")
        return info

    @contextmanager
    def open(self, name: str, limit: int) -> Iterator[BinaryIO]:
        """A file of this commit, read by ranges, fetching at most `limit` bytes of it."""

        def fetch(start: int, end: int) -> bytes:
            return self._fetch_range(name, start, end)

        what = f"{excerpt(name)} of {self._label}"
        yield cast(BinaryIO, RangedFile(fetch, self.sizes[name], limit=limit, what=what))

    def read_small(self, name: str, limit: int) -> bytes | None:
        """A whole file of at most `limit` bytes (a config); None, unread, if larger."""
        size = self.sizes[name]
        if size > limit:
            return None
        return self._fetch_range(name, 0, size) if size else b""

    def _fetch_range(self, name: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of a file: a ranged GET, read no further than the range."""
        label = f"{excerpt(name)} of {self._label}"
        self.budget.spend(end - start, label)
        url = self._urls.get(name) or self._client.url(
            f"{quote(self.hub.repo_id)}/resolve/{self.commit}/{quote(name)}"
        )
        headers = {"Range": f"bytes={start}-{end - 1}"}
        with transport_errors(label), self._client.get(url, headers) as answer:
            if answer.status_code not in (200, 206):
                raise status_error(answer, label)
            _check_range(answer, start, end, self.sizes[name], label)
            data = read_prefix(answer, end - start, self.budget.deadline)
            self._urls[name] = str(answer.url)
        if len(data) != end - start:
            raise Unavailable(
                f"the hub's answer for {label} ended at {start + len(data)} of bytes "
                f"{start}-{end - 1}; retry"
            )
        return data


def _check_range(answer: Any, start: int, end: int, size: int, label: str) -> None:
    """The answer holds bytes from `start` of a file of `size` bytes, or it is refused."""
    if answer.status_code == 200:
        if start != 0:  # the whole file from byte 0: the range is not in what was read
            raise Unavailable(
                f"the hub ignored the byte range asked of {label}: reading its header "
                f"would mean downloading all {size} bytes; not read. Check --hf-endpoint"
            )
        return
    found = _CONTENT_RANGE.fullmatch(answer.headers.get("Content-Range", "").strip())
    if found is not None and int(found[3]) != size:
        raise DataLoss(
            f"the hub lists {label} at {size} bytes but serves it as {found[3]}: not read. "
            "Check --hf-endpoint"
        )
    if found is None or int(found[1]) != start:
        raise Unavailable(
            f"the hub answered bytes {start}-{end - 1} of {label} with the range "
            f"{excerpt(answer.headers.get('Content-Range', ''))}; retry, and check "
            "--hf-endpoint if it happens again"
        )


def _siblings(info: dict[str, Any], label: str) -> list[dict[str, Any]]:
    siblings = info.get("siblings") or []
    if not isinstance(siblings, list) or not all(isinstance(s, dict) for s in siblings):
        raise Unavailable(f"the hub's listing of {label} has no usable file list; retry")
    return siblings


def _text(value: object) -> str | None:
    """A string the hub sent where a string belongs; anything else counts as absent."""
    return value if isinstance(value, str) else None


def _size(repo: str, name: str, size: object) -> int:
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise Unavailable(
            f"the hub listed {excerpt(name)} of {excerpt(repo)} without a usable size "
            f"({excerpt(repr(size))})"
        )
    return size
