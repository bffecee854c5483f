"""A Hugging Face Hub on loopback: the HTTP calls huggingface_hub makes, over real files.

No machine here reaches huggingface.co, so the tests that admit and pull hub
models (issue 19) point huggingface_hub at this server instead (`endpoint=` in
process, HF_ENDPOINT for a server process). It answers what the library asks:

- GET /api/models/{repo}[/revision/{rev}] (model_info; `?blobs=true` adds sizes),
- GET /api/models/{repo}/tree/{rev}[/{path}] and POST .../paths-info/{rev},
- HEAD and GET /{repo}/resolve/{rev}/{path}: small files directly, with ETag and
  X-Repo-Commit; large ("LFS") ones as a 302 to /lfs/{sha256} with X-Linked-Etag
  and X-Linked-Size, as the real hub redirects to its CDN,
- Range requests (206) on file bodies,
- 404s with X-Error-Code (RepoNotFound, EntryNotFound, RevisionNotFound) and 401
  with X-Error-Code GatedRepo for a gated repo asked without its token.

Every body byte sent is counted per repo path, so a test can assert what a step
transferred (zero weight bytes for a refusal, the header range for a GGUF).

A repo may also have named revisions (branches and tags, each its own commit
and files), and may misbehave the ways a broken or compromised hub would
(`Hostile`, issue 26): path-shaped ETags, bodies that differ from the listed
hash, listings that lie about sizes, bodies cut short, errors mid-transfer,
and a hook that runs a test's function partway through a body (`Midway`:
another account swapping a folder of the cache for a link while a pull runs).
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import parse_qs, unquote, urlsplit

# Files at least this large are served the way the hub serves LFS files.
LFS_FROM = 1024
# Bodies go out in slices this large (a client that stops reading stops them).
_SLICE = 256 << 10


@dataclass
class Midway:
    """Once `after` bytes of the next download of a file have been sent, `then()` runs
    on the hub's thread, and the body ends there (the connection closes): the client
    sees the cut only after `then` has returned."""

    after: int
    then: Callable[[], None]
    ran: threading.Event = field(default_factory=threading.Event)


@dataclass
class Hostile:
    """How a repo's answers go wrong; by default they do not."""

    # Sent as the ETag (and X-Linked-Etag) of every file, whatever its hash.
    etag: str | None = None
    # Served in place of a file's listed bytes (the listing keeps the real hash).
    body: dict[str, bytes] = field(default_factory=dict)
    # The size the listing gives a file, in place of its real one.
    listed_size: dict[str, int] = field(default_factory=dict)
    # What the next GETs of a file's body do, in order, before they behave:
    # "cut:N" ends the body after N bytes (the connection closes), "status:N"
    # answers HTTP N with no body.
    script: list[str] = field(default_factory=list)
    # Every request for a file (resolve) answers this status, e.g. a bare 403.
    status: int | None = None
    # Ranged requests are answered 200 with the whole file, from byte 0.
    ignore_range: bool = False
    # The listing (model info) carries this many bytes more, in a field nobody reads.
    listing_padding: int = 0
    # The padding made of these bytes repeated (JSON items, `{},` say) in an array
    # field nobody reads, rather than of one string.
    listing_filler: bytes = b""
    # Answers a redirect for every file, to this Location (taken as it is).
    redirect_to: str | None = None
    # Runs a function partway through the next download of each file named, then cuts it.
    midway: dict[str, Midway] = field(default_factory=dict)


@dataclass(frozen=True)
class OnDisk:
    """A file served from disk by ranges, never read whole: a sparse file of gigabytes
    costs the hub nothing. Its hashes are made up (the listing's are not checked
    until a pull, and nothing pulls these)."""

    path: Path

    @property
    def size(self) -> int:
        return self.path.stat().st_size

    def read(self, start: int, end: int) -> bytes:
        with self.path.open("rb") as file:
            file.seek(start)
            return file.read(end - start)


@dataclass
class FakeRepo:
    # Contents, or a file to read them from (read once, here), or one served from disk.
    files: Mapping[str, bytes | Path | OnDisk]
    # With a token, the repo is gated: requests without `Bearer {token}` get 401.
    token: str | None = None
    commit: str = ""  # the files' own hash unless given
    sha256: dict[str, str] = field(default_factory=dict)
    oid: dict[str, str] = field(default_factory=dict)
    hostile: Hostile = field(default_factory=Hostile)
    # Branches and tags other than main: each a commit of its own, with its files.
    revisions: dict[str, FakeRepo] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.files = {
            path: data.read_bytes() if isinstance(data, Path) else data
            for path, data in self.files.items()
        }
        for path, data in self.data.items():
            self.sha256[path] = hashlib.sha256(data).hexdigest()
            self.oid[path] = _git_oid(data)
        for path, kept in self.files.items():
            if isinstance(kept, OnDisk):
                made_up = hashlib.sha256(path.encode()).hexdigest()
                self.sha256[path], self.oid[path] = made_up, made_up[:40]
        if not self.commit:
            oids = "".join(f"{path}:{self.oid[path]}" for path in sorted(self.files))
            self.commit = hashlib.sha1(oids.encode()).hexdigest()

    @property
    def data(self) -> dict[str, bytes]:
        return {path: data for path, data in self.files.items() if isinstance(data, bytes)}

    def at(self, revision: str) -> FakeRepo | None:
        """The repo as of a revision: main, a branch or tag, or a commit of either."""
        if revision in ("main", self.commit):
            return self
        for name, version in self.revisions.items():
            if revision in (name, version.commit):
                return version
        return None

    def size(self, path: str) -> int:
        data = self.files[path]
        return data.size if isinstance(data, OnDisk) else len(self.data[path])

    def read(self, path: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of what the hub serves as the file."""
        data = self.files[path]
        if isinstance(data, OnDisk):
            return data.read(start, end)
        return self.hostile.body.get(path, self.data[path])[start:end]

    def entry(self, path: str, *, blobs: bool = True) -> dict[str, Any]:
        size = self.hostile.listed_size.get(path, self.size(path))
        item: dict[str, Any] = {"type": "file", "path": path, "oid": self.oid[path]}
        if blobs:
            item["size"] = size
            if size >= LFS_FROM:
                item["lfs"] = {"oid": self.sha256[path], "size": size, "pointerSize": 134}
        return item


@dataclass
class FakeHub:
    """The server and what it sent; `url` is the endpoint to hand huggingface_hub."""

    repos: dict[str, FakeRepo] = field(default_factory=dict)
    sent: Counter[str] = field(default_factory=Counter)  # "repo/path" -> body bytes
    requests: list[str] = field(default_factory=list)  # "METHOD path"
    with_token: list[str] = field(default_factory=list)  # paths asked with Authorization
    lock: threading.Lock = field(default_factory=threading.Lock)
    url: str = ""
    # Serve file bodies at this rate (None: as fast as the socket takes them).
    bytes_per_second: float | None = None
    _server: ThreadingHTTPServer | None = None

    def start(self, tls: ssl.SSLContext | None = None) -> FakeHub:
        """Serve on loopback: plain http on 127.0.0.1, or with `tls` https on localhost."""
        hub = self

        class Handler(_HubHandler):
            fake = hub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{port}"
        if tls is not None:
            self._server.socket = tls.wrap_socket(self._server.socket, server_side=True)
            self.url = f"https://localhost:{port}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def bytes_sent(self, repo_id: str, path: str | None = None) -> int:
        """Body bytes of a repo's files sent so far (of one file, with `path`)."""
        with self.lock:
            if path is not None:
                return self.sent[f"{repo_id}/{path}"]
            return sum(n for key, n in self.sent.items() if key.startswith(f"{repo_id}/"))

    def count(self, repo_id: str, path: str, sent: int) -> None:
        with self.lock:
            self.sent[f"{repo_id}/{path}"] += sent


class _Ask(NamedTuple):
    method: str
    repo_id: str
    repo: FakeRepo
    groups: dict[str, str]
    query: dict[str, list[str]]


_REPO = r"(?P<repo>[^/]+/[^/]+)"
_ROUTES = [
    ("info", re.compile(rf"^/api/models/{_REPO}(?:/revision/(?P<rev>[^/]+))?$")),
    ("tree", re.compile(rf"^/api/models/{_REPO}/tree/(?P<rev>[^/]+)(?:/(?P<path>.*))?$")),
    ("paths", re.compile(rf"^/api/models/{_REPO}/paths-info/(?P<rev>[^/]+)$")),
    ("resolve", re.compile(rf"^/{_REPO}/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")),
    ("lfs", re.compile(r"^/lfs/(?P<repo>[^/]+/[^/]+)/(?P<sha>[0-9a-f]{64})$")),
]


class _HubHandler(BaseHTTPRequestHandler):
    fake: FakeHub
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_HEAD(self) -> None:
        self._route("HEAD")

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def _route(self, method: str) -> None:
        split = urlsplit(self.path)
        path = unquote(split.path)
        with self.fake.lock:
            self.fake.requests.append(f"{method} {path}")
            if self.headers.get("Authorization"):
                self.fake.with_token.append(path)
        for name, pattern in _ROUTES:
            match = pattern.match(path)
            if match is None:
                continue
            repo = self.fake.repos.get(match["repo"])
            if repo is None:
                return self._error(HTTPStatus.NOT_FOUND, "RepoNotFound")
            signed = self.headers.get("Authorization") == f"Bearer {repo.token}"
            # The CDN (/lfs) asks no token: the real one is reached by a signed URL.
            if repo.token is not None and not signed and name != "lfs":
                return self._error(HTTPStatus.UNAUTHORIZED, "GatedRepo")
            groups: dict[str, str] = {k: v for k, v in match.groupdict().items() if v is not None}
            version = repo.at(unquote(groups.get("rev", "main")))
            if version is None:
                return self._error(HTTPStatus.NOT_FOUND, "RevisionNotFound")
            repo = version
            query = parse_qs(split.query)
            ask = _Ask(method, match["repo"], repo, groups, query)
            getattr(self, f"_{name}")(ask)
            return None
        self._error(HTTPStatus.NOT_FOUND, "RepoNotFound")

    def _info(self, ask: _Ask) -> None:
        method, repo_id, repo, _, query = ask
        blobs = query.get("blobs") == ["True"] or query.get("blobs") == ["true"]
        siblings = []
        for path in sorted(repo.files):
            item = repo.entry(path, blobs=blobs)
            sibling: dict[str, Any] = {"rfilename": path}
            if blobs:
                sibling.update(size=item["size"], blobId=item["oid"])
                if "lfs" in item:
                    sibling["lfs"] = {
                        "sha256": item["lfs"]["oid"],
                        "size": item["size"],
                        "pointerSize": 134,
                    }
            siblings.append(sibling)
        self._json(
            {
                "_id": repo_id,
                "id": repo_id,
                "modelId": repo_id,
                "sha": repo.commit,
                "private": False,
                "gated": "auto" if repo.token else False,
                "disabled": False,
                "tags": [],
                "siblings": siblings,
            },
            method,
            padding=repo.hostile.listing_padding,
            filler=repo.hostile.listing_filler,
        )

    def _tree(self, ask: _Ask) -> None:
        method, _, repo, groups, query = ask
        prefix = (groups.get("path") or "").strip("/")
        recursive = query.get("recursive") in (["True"], ["true"])
        entries: list[dict[str, Any]] = []
        folders: set[str] = set()
        for path in sorted(repo.files):
            if prefix and not path.startswith(prefix + "/"):
                continue
            rest = path[len(prefix) + 1 :] if prefix else path
            if "/" in rest and not recursive:
                folder = (prefix + "/" if prefix else "") + rest.split("/", 1)[0]
                if folder not in folders:
                    folders.add(folder)
                    entries.append({"type": "directory", "path": folder, "oid": "0" * 40})
                continue
            entries.append(repo.entry(path))
        self._json(entries, method)

    def _paths(self, ask: _Ask) -> None:
        method, _, repo, _, _ = ask
        length = int(self.headers.get("Content-Length") or 0)
        form = parse_qs(self.rfile.read(length).decode())
        wanted = form.get("paths", [])
        self._json([repo.entry(path) for path in wanted if path in repo.files], method)

    def _resolve(self, ask: _Ask) -> None:
        method, repo_id, repo, groups, _ = ask
        path = groups["path"]
        if path not in repo.files:
            return self._error(HTTPStatus.NOT_FOUND, "EntryNotFound", commit=repo.commit)
        if repo.hostile.status is not None:
            return self._bare(repo.hostile.status)
        if repo.hostile.redirect_to is not None:
            self.send_response(HTTPStatus.FOUND)
            self.send_header("Location", repo.hostile.redirect_to)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        size = repo.size(path)
        if size >= LFS_FROM:
            self.send_response(HTTPStatus.FOUND)
            # Absolute and to another host name, like the hub's CDN: huggingface_hub
            # follows only relative redirects itself (renamed repos) when it asks HEAD.
            port = self.headers.get("Host", "").rsplit(":", 1)[-1]
            self.send_header(
                "Location", f"http://localhost:{port}/lfs/{repo_id}/{repo.sha256[path]}"
            )
            self.send_header("X-Repo-Commit", repo.commit)
            self.send_header("X-Linked-Etag", f'"{repo.hostile.etag or repo.sha256[path]}"')
            self.send_header("X-Linked-Size", str(size))
            self.send_header("ETag", f'"{repo.hostile.etag or repo.oid[path]}"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        etag = repo.hostile.etag or repo.oid[path]
        self._body(method, repo_id, repo, path, etag=etag, commit=repo.commit)
        return None

    def _lfs(self, ask: _Ask) -> None:
        method, repo_id, top, groups, _ = ask
        for repo in [top, *top.revisions.values()]:
            for path in repo.files:
                if repo.size(path) >= LFS_FROM and repo.sha256[path] == groups["sha"]:
                    etag = repo.hostile.etag or groups["sha"]
                    return self._body(method, repo_id, repo, path, etag=etag, commit=None)
        return self._error(HTTPStatus.NOT_FOUND, "EntryNotFound")

    def _body(
        self, method: str, repo_id: str, repo: FakeRepo, path: str, *, etag: str, commit: str | None
    ) -> None:
        size = len(repo.hostile.body[path]) if path in repo.hostile.body else repo.size(path)
        cut: int | None = None
        midway: Midway | None = None
        # A download (the whole body, or its rest): not a header read by a bounded range.
        downloading = re.fullmatch(r"bytes=\d+-\d+", self.headers.get("Range", "")) is None
        if method == "GET" and downloading:
            with self.fake.lock:
                scripted = repo.hostile.script.pop(0) if repo.hostile.script else "ok"
                midway = repo.hostile.midway.pop(path, None)
            if midway is not None:
                cut = midway.after
            if scripted.startswith("status:"):
                return self._bare(int(scripted.removeprefix("status:")))
            if scripted.startswith("cut:"):
                cut = int(scripted.removeprefix("cut:"))
        start, end = 0, size
        status = HTTPStatus.OK
        ranged = re.fullmatch(r"bytes=(\d*)-(\d*)", self.headers.get("Range", ""))
        if ranged is not None and size and not repo.hostile.ignore_range:
            first, last = ranged.groups()
            if first:
                start, end = int(first), min(size, int(last) + 1 if last else size)
            else:  # a suffix: the last N bytes
                start = max(0, size - int(last))
            if start >= size:
                self.send_response(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            status = HTTPStatus.PARTIAL_CONTENT
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", f'"{etag}"')
        if commit is not None:
            self.send_header("X-Repo-Commit", commit)
        if status == HTTPStatus.PARTIAL_CONTENT:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        self.end_headers()
        if method != "GET":
            return
        if cut is not None:
            end = min(end, start + cut)
        self._send_range(repo, repo_id, path, start, end)
        if cut is not None:  # the connection drops before Content-Length bytes
            self.close_connection = True
            self.wfile.flush()
            if midway is not None:
                midway.then()
                midway.ran.set()
            self.connection.shutdown(socket.SHUT_RDWR)

    def _send_range(self, repo: FakeRepo, repo_id: str, path: str, start: int, end: int) -> None:
        """Bytes [start, end) of the file, a slice at a time (throttled if the hub is)."""
        rate = self.fake.bytes_per_second
        try:
            for offset in range(start, end, _SLICE):
                piece = repo.read(path, offset, min(offset + _SLICE, end))
                # Counted before it is written: the client may have read it all, and the
                # test asked, before this thread runs again.
                self.fake.count(repo_id, path, len(piece))
                self.wfile.write(piece)
                if rate is not None:
                    time.sleep(len(piece) / rate)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client stopped reading

    def _bare(self, status: int) -> None:
        """An error with no hub error code: what a proxy or a failing CDN answers."""
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _json(self, value: object, method: str, padding: int = 0, filler: bytes = b"") -> None:
        body = json.dumps(value).encode()
        # Padding goes in a string field before the object's end, sent as it is made; a
        # filler's items go in an array field, padding's length rounded to whole items.
        if padding and filler:
            padding -= padding % len(filler)
            head, tail = body[:-1] + b', "spaces": [', b"null]}"
        elif padding:
            head, tail = body[:-1] + b', "cardData": "', b'"}'
        else:
            head, tail = body, b""
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(head) + padding + len(tail)))
        self.end_headers()
        if method == "HEAD":
            return
        try:
            self.wfile.write(head)
            unit = filler or b"x"
            per_slice = max(1, _SLICE // len(unit))
            for start in range(0, padding, per_slice * len(unit)):
                self.wfile.write(unit * (min(per_slice * len(unit), padding - start) // len(unit)))
            self.wfile.write(tail)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client stopped reading

    def _error(self, status: HTTPStatus, code: str, commit: str | None = None) -> None:
        body = json.dumps({"error": code}).encode()
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if commit is not None:
            self.send_header("X-Repo-Commit", commit)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


def _git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
