"""Downloading a hub model's files into the hub cache, with progress, one transfer per model.

Each file is fetched by service.hub.fetch: into a partial file named by its
listed hash, resumed where an earlier attempt stopped, checked against its
size and hash, then moved into place and linked into the snapshot (the cache
layout transformers and `hf` read). Files already in the cache are hashed
before they count as there: one that fails is deleted and fetched again.

A transfer reserves the bytes it has yet to write on the cache's disk
(service.hub.disk), so pulls that would not fit together do not start
together. Concurrent pulls of the same files share one transfer: each
caller follows its progress, and the transfer stops at the next chunk only
when every caller has gone, keeping its partial file for the next pull.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from dataclasses import dataclass, replace
from pathlib import Path

from service.errors import excerpt
from service.hub.cache import RepoCache
from service.hub.client import HubAccess, HubClient
from service.hub.disk import Reservations, cache_failure
from service.hub.download import Download
from service.hub.fetch import FileFetch, HubFile
from service.hub.trust import check_revision
from service.model_source import HubReference

# Progress is published at most this often (a chunk is 1 MiB; small files are many).
_PUBLISH_EVERY = 0.1


@dataclass(frozen=True)
class PullState:
    file: str = ""
    file_done: int = 0
    file_total: int = 0
    done: int = 0  # bytes of the download in the cache, all files
    total: int = 0
    cached: int = 0  # bytes that were in the cache before this transfer
    transferred: int = 0  # bytes that crossed the network
    rate: float = 0.0  # transferred per second so far
    finished: bool = False
    error: BaseException | None = None
    # The cache has been looked at: `cached` and `done` count what was there.
    surveyed: bool = False


class Puller:
    """The transfers under way, by repo, commit and files."""

    def __init__(self, access: HubAccess, cache_dir: Path) -> None:
        self._access = access
        self._cache_dir = cache_dir
        self._reservations = Reservations(cache_dir)
        self._transfers: dict[tuple[str, str, tuple[str, ...]], _Transfer] = {}

    async def pull(self, hub: HubReference, download: Download) -> AsyncGenerator[PullState, None]:
        """The transfer's states until it ends, joining one under way for the same files.
        The last state is `finished`; a failed transfer raises its error."""
        key = (download.repo_id, download.commit, tuple(download.files))
        transfer = self._transfers.get(key)
        # One whose callers all left is stopping: its next chunk raises. Start afresh
        # (huggingface_hub's lock on the file makes this one wait for it to let go).
        if transfer is None or transfer.cancel.is_set():
            transfer = _Transfer(hub, download, self._access, self._cache_dir, self._reservations)
            self._transfers[key] = transfer
            transfer.start(lambda: self._forget(key, transfer))
        transfer.followers += 1
        try:
            async with aclosing(transfer.states()) as states:
                async for state in states:
                    if state.error is not None:
                        raise state.error
                    yield state
        finally:
            transfer.followers -= 1
            if transfer.followers == 0:
                transfer.cancel.set()

    def busy(self, repo_id: str) -> bool:
        """Whether a transfer of the repo is under way."""
        return any(key[0] == repo_id for key in self._transfers)

    def _forget(self, key: tuple[str, str, tuple[str, ...]], transfer: _Transfer) -> None:
        if self._transfers.get(key) is transfer:  # not a newer one under the same key
            del self._transfers[key]


class _Transfer:
    def __init__(
        self,
        hub: HubReference,
        download: Download,
        access: HubAccess,
        cache_dir: Path,
        reservations: Reservations,
    ) -> None:
        self.hub = hub
        self.download = download
        self.access = access
        self.cache = RepoCache(cache_dir, download.repo_id)
        self.reservations = reservations
        self.followers = 0
        self.cancel = threading.Event()
        self.state = PullState(total=download.total_bytes)
        self._changed = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._started = time.monotonic()
        self._published = 0.0

    def start(self, on_end: Callable[[], None]) -> None:
        async def run() -> None:
            try:
                # A thread of its own: a transfer lasts minutes, and must not hold one
                # of the threads that loads and admissions share.
                done = asyncio.get_running_loop().create_future()
                thread = threading.Thread(
                    target=self._run_then, args=(done,), name="pull", daemon=True
                )
                thread.start()
                await done
            finally:
                on_end()

        self._task = asyncio.create_task(run())

    async def states(self) -> AsyncGenerator[PullState, None]:
        while True:
            state = self.state
            if state.surveyed or state.finished:
                yield state
            if state.finished:
                return
            if self.state is state:  # nothing new since: wait for the next
                self._changed.clear()
                await self._changed.wait()

    # --- on the transfer's thread ---------------------------------------------------

    def _run_then(self, done: asyncio.Future[None]) -> None:
        try:
            self._run()
        finally:
            self._loop.call_soon_threadsafe(_resolve, done)

    def _run(self) -> None:
        try:
            self._fetch_all_explained()
        except BaseException as exc:  # the followers raise it; the thread ends quietly
            self._publish(replace(self.state, error=exc, finished=True))
        else:
            self._publish(replace(self.state, finished=True))

    def _fetch_all_explained(self) -> None:
        """The transfer, with what the cache's file system refused said plainly."""
        try:
            self._fetch_all()
        except OSError as exc:
            failure = cache_failure(exc, self.cache.root, f"pulling {excerpt(str(self.hub))}")
            if failure is None:
                raise
            raise failure from exc

    def _fetch_all(self) -> None:
        download = self.download
        files = [
            HubFile(name, size, download.digests[name]) for name, size in download.files.items()
        ]
        missing = [file for file in files if not self._in_cache(file)]
        kept = {file.name: _kept_bytes(self.cache, file) for file in missing}
        done = download.total_bytes - sum(f.size for f in missing) + sum(kept.values())
        self._publish(replace(self.state, done=done, cached=done, surveyed=True), force=True)
        what = f"pulling {excerpt(str(self.hub))}"
        self.reservations.reserve(self, sum(f.size for f in missing) - sum(kept.values()), what)
        try:
            self.cache.prepare()
            with HubClient(self.access) as client:
                fetch = FileFetch(
                    client,
                    self.cache,
                    download.repo_id,
                    download.commit,
                    self._advance,
                    self.cancel,
                )
                for file in sorted(missing, key=lambda f: _marks_complete(f.name)):
                    self._publish(
                        replace(
                            self.state,
                            file=file.name,
                            file_done=kept[file.name],
                            file_total=file.size,
                        )
                    )
                    fetch.fetch(file)
                    self._publish(replace(self.state, file_done=file.size), force=True)
            self._write_ref()
        finally:
            self.reservations.release(self)

    def _in_cache(self, file: HubFile) -> bool:
        """Whether the snapshot holds this file, whole and with the listed hash. A blob
        that fails the check is deleted; one another commit shares is linked."""
        commit, blob = self.download.commit, file.digest.hex
        linked = self.cache.linked_blob(commit, file.name)
        if linked is not None and linked != blob:
            self.cache.unlink(commit, file.name)
        if not self.cache.has_blob(file.digest):
            return False
        if not self.cache.verified(file.digest, file.size):
            self.cache.remove_blob(file.digest)
            self.cache.unlink(commit, file.name)
            return False
        if linked != blob:
            self.cache.link(commit, file.name, file.digest)
        return True

    def _write_ref(self) -> None:
        """refs/<revision> (main when none was named), so the name finds this snapshot."""
        revision = self.hub.revision or "main"
        if revision != self.download.commit:
            self.cache.write_ref(check_revision(self.hub.repo_id, revision), self.download.commit)

    def _advance(self, count: int) -> None:
        self.reservations.written(self, count)
        state = self.state
        transferred = state.transferred + count
        elapsed = max(time.monotonic() - self._started, 1e-6)
        self._publish(
            replace(
                state,
                file_done=state.file_done + count,
                done=state.done + count,
                transferred=transferred,
                rate=transferred / elapsed,
            )
        )

    def _publish(self, state: PullState, *, force: bool = False) -> None:
        """Set the state; wake the followers at most every _PUBLISH_EVERY seconds."""
        self.state = state
        now = time.monotonic()
        if force or state.finished or now - self._published >= _PUBLISH_EVERY:
            self._published = now
            self._loop.call_soon_threadsafe(self._changed.set)


def _resolve(done: asyncio.Future[None]) -> None:
    if not done.done():
        done.set_result(None)


def _kept_bytes(cache: RepoCache, file: HubFile) -> int:
    """Bytes of the file an earlier pull left in its partial file (0 if none)."""
    return min(cache.partial_size(file.digest) or 0, file.size)


def _marks_complete(name: str) -> bool:
    """The files that make a cached snapshot a model (service.models.sources), fetched
    last: until they are there, a half-pulled model is "not downloaded"."""
    return name in ("config.json", "model_index.json")
