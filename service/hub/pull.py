"""Downloading a hub model's files into the hub cache, with progress, one transfer per model.

The files are fetched by huggingface_hub's own `hf_hub_download`: its cache
layout (the one transformers and `hf download` use), its lock per file, ETag
and size checks, retries that resume within one call, and a snapshot link that
appears only once a file is whole. Progress comes from the progress-bar class
it accepts: each chunk it writes is reported to `_Transfer`, which is also
where a cancelled pull stops it (the next chunk raises). huggingface_hub then
deletes its partial file (2.x keeps no partial files across calls), so a
cancelled pull leaves nothing behind, and the next one starts over.

Concurrent pulls of the same files share one transfer: each caller follows
its progress, and the transfer stops only when every caller has gone.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from huggingface_hub import hf_hub_download, try_to_load_from_cache

from service.errors import Unavailable, excerpt
from service.hub.download import Download
from service.hub.remote import HubAccess, hub_errors
from service.model_source import HubReference

# Progress is published at most this often (a chunk is 10 MB; small files are many).
_PUBLISH_EVERY = 0.1


class PullCancelled(Exception):
    """Every caller of a transfer went away: it stops at the next chunk."""


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


class Puller:
    """The transfers under way, by repo, commit and files."""

    def __init__(self, access: HubAccess, cache_dir: Path) -> None:
        self._access = access
        self._cache_dir = cache_dir
        self._transfers: dict[tuple[str, str, tuple[str, ...]], _Transfer] = {}

    async def pull(self, hub: HubReference, download: Download) -> AsyncIterator[PullState]:
        """The transfer's states until it ends, joining one under way for the same files.
        The last state is `finished`; a failed transfer raises its error."""
        key = (download.repo_id, download.commit, tuple(download.files))
        transfer = self._transfers.get(key)
        # One whose callers all left is stopping: its next chunk raises. Start afresh
        # (huggingface_hub's lock on the file makes this one wait for it to let go).
        if transfer is None or transfer.cancel.is_set():
            transfer = _Transfer(hub, download, self._access, self._cache_dir)
            self._transfers[key] = transfer
            transfer.start(lambda: self._forget(key, transfer))
        transfer.followers += 1
        try:
            async for state in transfer.states():
                if state.error is not None:
                    raise state.error
                yield state
        finally:
            transfer.followers -= 1
            if transfer.followers == 0:
                transfer.cancel.set()

    def _forget(self, key: tuple[str, str, tuple[str, ...]], transfer: _Transfer) -> None:
        if self._transfers.get(key) is transfer:  # not a newer one under the same key
            del self._transfers[key]


class _Transfer:
    def __init__(
        self, hub: HubReference, download: Download, access: HubAccess, cache_dir: Path
    ) -> None:
        self.hub = hub
        self.download = download
        self.access = access
        self.cache_dir = cache_dir
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
                await asyncio.to_thread(self._run)
            finally:
                on_end()

        self._task = asyncio.create_task(run())

    async def states(self) -> AsyncIterator[PullState]:
        while True:
            state = self.state
            yield state
            if state.finished:
                return
            if self.state is state:  # nothing new since: wait for the next
                self._changed.clear()
                await self._changed.wait()

    # --- on the transfer's thread ---------------------------------------------------

    def _run(self) -> None:
        try:
            self._fetch_all()
        except BaseException as exc:  # the followers raise it; the thread ends quietly
            self._publish(replace(self.state, error=exc, finished=True))
        else:
            self._publish(replace(self.state, finished=True))

    def _fetch_all(self) -> None:
        files = self.download.files
        cached = {name: size for name, size in files.items() if self._in_cache(name)}
        done = sum(cached.values())
        self._publish(replace(self.state, done=done, cached=done))
        for name, size in sorted(files.items(), key=lambda item: _marks_complete(item[0])):
            if name in cached:
                continue
            self._publish(replace(self.state, file=name, file_done=0, file_total=size))
            with hub_errors(self.hub):
                path = hf_hub_download(
                    self.download.repo_id,
                    name,
                    revision=self.hub.revision or "main",
                    cache_dir=self.cache_dir,
                    endpoint=self.access.endpoint,
                    token=self.access.token or False,
                    tqdm_class=self._progress_class(),
                )
            if f"/snapshots/{self.download.commit}/" not in Path(path).as_posix():
                raise Unavailable(
                    f"{excerpt(str(self.hub))} changed on the hub during the pull (it now "
                    f"resolves past {self.download.commit[:12]}): pull it again"
                )
            done += size
            self._publish(replace(self.state, file_done=size, done=done), force=True)

    def _in_cache(self, name: str) -> bool:
        found = try_to_load_from_cache(
            self.download.repo_id, name, cache_dir=self.cache_dir, revision=self.download.commit
        )
        return isinstance(found, str)

    def _progress_class(self) -> type:
        transfer = self

        class Progress:
            """What hf_hub_download takes for a progress bar: it reports each chunk."""

            def __init__(self, *, initial: int = 0, **_: Any) -> None:
                state = transfer.state
                transfer._publish(replace(state, file_done=initial, done=state.done + initial))

            def update(self, count: int = 1) -> None:
                if transfer.cancel.is_set():
                    raise PullCancelled("every caller of this pull went away")
                transfer._advance(count)

            def close(self) -> None:
                pass

            def __enter__(self) -> Progress:
                return self

            def __exit__(self, *_: object) -> None:
                pass

        return Progress

    def _advance(self, count: int) -> None:
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


def _marks_complete(name: str) -> bool:
    """The files that make a cached snapshot a model (service.models.sources), fetched
    last: until they are there, a half-pulled model is "not downloaded"."""
    return name in ("config.json", "model_index.json")
