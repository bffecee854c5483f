"""Admission of a hub model that is not on disk yet, from the hub's metadata alone.

The same gates as for a local file (see `service.admission`), fed by what
`service.hub.remote` reads over HTTP: a GGUF's header (every part's, for a
split one), a checkpoint's config.json, a pipeline's model_index.json and one
safetensors header. The answer adds what a download would take (the files the
backend needs, their bytes) and whether that fits on the disk holding the hub
cache. Descriptions are kept per commit, so asking again costs one call for the
file list; a refusal is not kept (a read garbled in transit must not outlive it).
What is kept is small and bounded: the description's scalars and short strings (never
the parsed config), the kind, and the names and sizes of the files a download takes; at
most REMEMBERED_ENTRY_BYTES each (a larger one, a repo of thousands of shards, is read
again next time instead) and REMEMBERED entries: REMEMBERED_BYTES in all.

What the reads may cost (bytes, time, how many at once) is service.hub.budget's.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.admission.describe import (
    MAX_JSON_BYTES,
    ModelDescription,
    UnreadableModel,
    checkpoint_description,
    describe_gguf_parts,
    json_object,
    pipeline_description,
    read_gguf_part,
    safetensors_dtype_from,
)
from service.admission.gguf_header import GGUFHeader
from service.hub.budget import HEADER_BYTES, BudgetSpent, ReadBudget, ReadSlots
from service.hub.client import HubAccess, HubClient
from service.hub.disk import free_bytes
from service.hub.download import Download
from service.hub.files import (
    PIPELINE_WEIGHTS,
    checkpoint_files,
    gguf_choices,
    gguf_parts,
    pick_gguf,
    pipeline_files,
    repo_kind,
)
from service.hub.remote import RemoteRepo
from service.model_source import HubReference, SourceKind

# Descriptions remembered, each at most REMEMBERED_ENTRY_BYTES as `footprint` counts
# it (a 400-shard checkpoint's file list fits: some 170 bytes a file).
REMEMBERED = 64
REMEMBERED_ENTRY_BYTES = 96 << 10
REMEMBERED_BYTES = REMEMBERED * REMEMBERED_ENTRY_BYTES
# A safetensors header: 8 bytes of length, then at most 16 MiB of JSON (what is read).
_SAFETENSORS_HEADER_BYTES = 8 + (16 << 20)
_slots = ReadSlots()


@dataclass(frozen=True)
class RemoteModel:
    kind: SourceKind
    # None when the metadata cannot be read; `problem` says why.
    description: ModelDescription | None
    problem: str
    download: Download


def read_remote(hub: HubReference, access: HubAccess, cache_dir: Path) -> RemoteModel:
    """What a hub model is and what a download would take, reading no weights, within
    the byte budget and the access's metadata deadline."""
    budget = ReadBudget(seconds=access.metadata_seconds)
    _slots.acquire(budget)
    try:
        with HubClient(access) as client:
            repo = RemoteRepo(hub, client, budget)
            found = _remembered_or_read(repo, hub, access.endpoint)
    finally:
        _slots.release()
    kind, description, problem, files = found
    download = Download(
        hub.repo_id,
        repo.commit,
        files,
        free_bytes(cache_dir),
        digests={name: repo.digests[name] for name in files},
        choices=gguf_choices(repo.sizes) if kind == "gguf" else {},
    )
    return RemoteModel(kind, description, problem, download)


_Read = tuple[SourceKind, ModelDescription | None, str, dict[str, int]]
_Key = tuple[str, str, str, str | None]


@dataclass(frozen=True)
class Remembered:
    """What a successful read leaves for the next Admit of the same commit."""

    kind: SourceKind
    description: ModelDescription
    files: tuple[tuple[str, int], ...]  # the download's files and their sizes

    def read(self) -> _Read:
        return self.kind, self.description, "", dict(self.files)


_remembered: OrderedDict[_Key, Remembered] = OrderedDict()
_lock = threading.Lock()


def _remembered_or_read(repo: RemoteRepo, hub: HubReference, endpoint: str) -> _Read:
    """A description read before for this commit, or a fresh read, kept if it succeeded
    and is small enough (see `remember`)."""
    key = (endpoint, hub.repo_id, repo.commit, hub.file)
    with _lock:
        found = _remembered.get(key)
    if found is not None:
        return found.read()
    kind, description, problem, files = _read(repo, hub)
    if description is not None:
        remember(key, Remembered(kind, description, tuple(files.items())))
    return kind, description, problem, files


def remember(key: _Key, entry: Remembered) -> bool:
    """Keep `entry` (the oldest goes past REMEMBERED), unless its footprint is over
    REMEMBERED_ENTRY_BYTES: then it is not kept, and whether it was kept is returned."""
    if footprint(entry) + footprint(key) > REMEMBERED_ENTRY_BYTES:
        return False
    with _lock:
        _remembered[key] = entry
        while len(_remembered) > REMEMBERED:
            _remembered.popitem(last=False)
    return True


def remembered_bytes() -> int:
    """The footprint of every remembered entry and its key: at most REMEMBERED_BYTES."""
    with _lock:
        entries = list(_remembered.items())
    return sum(footprint(key) + footprint(entry) for key, entry in entries)


def footprint(value: object) -> int:
    """The bytes `value` holds, as sys.getsizeof counts them, through its dataclass
    fields, tuples, sets and mappings (shared objects, interned or not, counted each
    time: an over-estimate). Descriptions are small, so the walk is short; a big file
    list is walked once, to be refused."""
    size = sys.getsizeof(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = dataclasses.fields(value)
        return size + sum(footprint(getattr(value, field.name)) for field in fields)
    if isinstance(value, Mapping):
        return size + sum(footprint(key) + footprint(item) for key, item in value.items())
    if isinstance(value, tuple | list | frozenset | set):
        return size + sum(footprint(item) for item in value)
    return size


def _read(repo: RemoteRepo, hub: HubReference) -> _Read:
    sizes = repo.sizes
    kind = repo_kind(sizes, hub.file)
    if kind == "gguf":
        name = pick_gguf(sizes, hub.file, str(hub))
        files = gguf_parts(name, sizes)
    elif kind == "checkpoint":
        files = checkpoint_files(sizes)
    elif kind == "diffusers":
        files = []  # known once model_index.json names the components
    else:
        problem = (
            f"{hub.repo_id} holds no model this service reads: no GGUF file, no config.json "
            "beside safetensors weights, and no model_index.json"
        )
        return kind, None, problem, {}
    try:
        description, files = _describe(repo, kind, files)
    except (UnreadableModel, BudgetSpent) as exc:
        return kind, None, str(exc), {name: sizes[name] for name in files}
    return kind, description, "", {name: sizes[name] for name in files}


def _describe(
    repo: RemoteRepo, kind: SourceKind, files: list[str]
) -> tuple[ModelDescription, list[str]]:
    """The description, and the files a download takes (a pipeline's are known only
    once its model_index.json is read)."""
    if kind == "gguf":
        return _describe_gguf(repo, files), files
    if kind == "checkpoint":
        safetensors = sum(repo.sizes[name] for name in files if name.endswith(".safetensors"))
        return checkpoint_description(_read_json(repo, "config.json"), safetensors), files
    return _describe_pipeline(repo)


def _describe_gguf(repo: RemoteRepo, parts: list[str]) -> ModelDescription:
    """From every part's header, each read by ranges up to its own end (never its
    weights), joined as a local split GGUF's parts are."""

    def read(index: int) -> GGUFHeader:
        with repo.open(parts[index], HEADER_BYTES) as remote:
            return read_gguf_part(remote, repo.sizes[parts[index]], parts, index)

    return describe_gguf_parts(parts, read)


def _describe_pipeline(repo: RemoteRepo) -> tuple[ModelDescription, list[str]]:
    index = _read_json(repo, "model_index.json")
    components = [key for key, value in index.items() if isinstance(value, list)]
    files = pipeline_files(repo.sizes, components)
    weights = [name for name in files if name.endswith(PIPELINE_WEIGHTS)]
    dtype = None
    first = next((name for name in weights if name.endswith(".safetensors")), None)
    if first is not None:
        with repo.open(first, _SAFETENSORS_HEADER_BYTES) as remote:
            dtype = safetensors_dtype_from(remote)
    total = sum(repo.sizes[name] for name in weights)
    return pipeline_description(index, total, dtype or "float32"), files


def _read_json(repo: RemoteRepo, name: str) -> dict[str, Any]:
    """A config of the repo, parsed as a local one is (UnreadableModel when broken)."""
    return json_object(repo.read_small(name, MAX_JSON_BYTES) or b"", name, repo.sizes[name])
