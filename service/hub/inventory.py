"""What the hub cache holds, and removing a model from it.

huggingface_hub's own cache scanner reads the layout (the same one `hf cache
ls` shows); this adds the partial files of interrupted pulls to each repo
and turns a deletion request (a repo, or one revision of it by branch, tag
or commit) into the scanner's own deletion plan, which removes snapshots,
their refs, and the blobs no other revision uses.
"""

from __future__ import annotations

import os
import shutil
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from huggingface_hub import CachedRepoInfo, HFCacheInfo, scan_cache_dir
from huggingface_hub.errors import CacheNotFound

from service.errors import ModelNotFound, excerpt
from service.hub.cache import RepoCache
from service.model_source import HubReference


@dataclass(frozen=True)
class CachedRevision:
    commit: str
    refs: list[str]
    files: dict[str, int]  # name in the snapshot -> bytes
    size: int
    last_modified: float


@dataclass(frozen=True)
class CachedModel:
    repo_id: str
    revisions: list[CachedRevision] = field(default_factory=list)
    size: int = 0  # blobs once each, and partial files
    incomplete: int = 0
    last_used: float = 0.0


def cached_models(cache_dir: Path) -> list[CachedModel]:
    """Every model repo in the cache, by name, with its interrupted pulls' bytes."""
    if not os.path.isdir(cache_dir):
        return []
    info = scan_cache_dir(cache_dir)
    partial: dict[str, int] = defaultdict(int)
    for incomplete in info.incomplete_files:
        partial[incomplete.file_path.parent.parent.name] += incomplete.size_on_disk
    models = {
        repo.repo_id: _model(repo, partial.pop(repo.repo_path.name, 0))
        for repo in info.repos
        if repo.repo_type == "model"
    }
    for folder, size in partial.items():  # repos with nothing but an interrupted pull
        repo_id = _repo_id(folder)
        if repo_id is not None and repo_id not in models:
            models[repo_id] = CachedModel(repo_id, size=size, incomplete=size)
    return [models[name] for name in sorted(models)]


def delete_cached(cache_dir: Path, hub: HubReference) -> tuple[list[str], int]:
    """Delete a repo (no revision) or one revision of it: the commits deleted, bytes freed."""
    if hub.revision is None:
        return _delete_repo(cache_dir, hub.repo_id)
    info = _scan(cache_dir)
    repo = _repo(info, hub.repo_id)
    commits = [
        revision.commit_hash
        for revision in repo.revisions
        if hub.revision in (revision.commit_hash, *revision.refs)
    ]
    if not commits:
        raise ModelNotFound(
            f"the hub cache holds no revision {excerpt(hub.revision)} of {excerpt(hub.repo_id)}"
        )
    plan = info.delete_revisions(*commits)
    plan.execute()
    return commits, plan.expected_freed_size


def _delete_repo(cache_dir: Path, repo_id: str) -> tuple[list[str], int]:
    """The whole repo folder, interrupted pulls included."""
    found = [m for m in cached_models(cache_dir) if m.repo_id == repo_id]
    if not found:
        raise ModelNotFound(f"the hub cache holds no copy of {excerpt(repo_id)}")
    folder = RepoCache(cache_dir, repo_id).folder
    shutil.rmtree(folder)
    return [revision.commit for revision in found[0].revisions], found[0].size


def _scan(cache_dir: Path) -> HFCacheInfo:
    try:
        return scan_cache_dir(cache_dir)
    except CacheNotFound:
        raise ModelNotFound(f"the hub cache {cache_dir} does not exist yet") from None


def _repo(info: HFCacheInfo, repo_id: str) -> CachedRepoInfo:
    for repo in info.repos:
        if repo.repo_id == repo_id and repo.repo_type == "model":
            return repo
    raise ModelNotFound(f"the hub cache holds no copy of {excerpt(repo_id)}")


def _model(repo: CachedRepoInfo, incomplete: int) -> CachedModel:
    revisions = [
        CachedRevision(
            commit=revision.commit_hash,
            refs=sorted(revision.refs),
            files={
                _relative(f.file_path, revision.snapshot_path): f.size_on_disk
                for f in revision.files
            },
            size=revision.size_on_disk,
            last_modified=revision.last_modified,
        )
        for revision in sorted(repo.revisions, key=lambda r: r.last_modified)
    ]
    return CachedModel(
        repo.repo_id,
        revisions,
        size=repo.size_on_disk + incomplete,
        incomplete=incomplete,
        last_used=repo.last_accessed,
    )


def _relative(path: Path, snapshot: Path) -> str:
    return path.relative_to(snapshot).as_posix()


def _repo_id(folder: str) -> str | None:
    kind, _, rest = folder.partition("--")
    return rest.replace("--", "/") if kind == "models" and "--" in rest else None
