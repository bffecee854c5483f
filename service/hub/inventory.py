"""What the hub cache holds, and removing a model from it.

huggingface_hub's own cache scanner reads the layout (the same one `hf cache
ls` shows); this adds the partial files of interrupted pulls to each repo.

A deletion (a repo, or one revision of it by branch, tag or commit) is ours,
not the scanner's plan: that one deletes whatever a snapshot's links resolve
to, and a link planted in a snapshot led it to delete a file outside the
cache. Here links are removed as links, a blob is deleted only if it is an
entry of the repo's own blobs/ that a snapshot's link names directly, the
repo's folder itself must not be a link, and "freed" counts only files whose
last name went (what the file system really gives back).
"""

from __future__ import annotations

import os
import shutil
import stat
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from huggingface_hub import CachedRepoInfo, scan_cache_dir

from service.errors import ModelNotFound, excerpt
from service.hub.cache import OutsideCache, RepoCache, remove
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
    """Delete a repo (no revision) or one revision of it: the commits deleted, and the
    bytes the file system gave back (files whose last name went; 0 for links)."""
    cache = RepoCache(cache_dir, hub.repo_id)
    _check_folder(cache, hub.repo_id)
    if hub.revision is None:
        return _delete_repo(cache)
    commits = _commits_named(cache, hub.revision)
    if not commits:
        raise ModelNotFound(
            f"the hub cache holds no revision {excerpt(hub.revision)} of {excerpt(hub.repo_id)}"
        )
    freed = 0
    for commit in commits:
        freed += _delete_revision(cache, commit)
    return commits, freed


def snapshot_folder(cache_dir: Path, hub: HubReference) -> str | None:
    """The folder whose files a deletion of `hub` removes: a revision's snapshot, or
    the repo's folder (None if the revision is not cached)."""
    cache = RepoCache(cache_dir, hub.repo_id)
    if hub.revision is None:
        return cache.folder
    commits = _commits_named(cache, hub.revision) if os.path.isdir(cache.folder) else []
    return os.path.join(cache.folder, "snapshots", commits[0]) if len(commits) == 1 else None


def _check_folder(cache: RepoCache, repo_id: str) -> None:
    """The repo's folder is a folder inside the cache: a link is refused, not followed."""
    try:
        info = os.lstat(cache.folder)
    except FileNotFoundError:
        raise ModelNotFound(f"the hub cache holds no copy of {excerpt(repo_id)}") from None
    if stat.S_ISLNK(info.st_mode):
        raise OutsideCache(cache.folder, cache.root)
    if not stat.S_ISDIR(info.st_mode):
        raise ModelNotFound(f"the hub cache holds no copy of {excerpt(repo_id)}")


def _delete_repo(cache: RepoCache) -> tuple[list[str], int]:
    """The whole repo folder, interrupted pulls included; links inside it go as links."""
    snapshots = os.path.join(cache.folder, "snapshots")
    commits = sorted(os.listdir(snapshots)) if os.path.isdir(snapshots) else []
    freed = sum(_freed_by_unlinking(path) for path in _entries(cache.folder))
    shutil.rmtree(cache.folder)  # never follows a link (fd-based on Linux)
    return commits, freed


def _delete_revision(cache: RepoCache, commit: str) -> int:
    """A snapshot, the refs naming it, and the blobs no other snapshot links to."""
    snapshot = os.path.join(cache.folder, "snapshots", commit)
    blobs = _linked_blobs(cache, snapshot)
    freed = 0
    if os.path.islink(snapshot):
        remove(snapshot)  # the link, not where it leads
    else:
        freed += sum(_freed_by_unlinking(path) for path in _entries(snapshot))
        shutil.rmtree(snapshot)
    for ref in _refs(cache):
        if _ref_commit(ref) == commit:
            remove(ref)
    still_linked: set[str] = set()
    for other in _snapshots(cache):
        still_linked |= _linked_blobs(cache, other)
    for blob in blobs - still_linked:
        freed += _freed_by_unlinking(blob)
        remove(blob)
    return freed


def _commits_named(cache: RepoCache, revision: str) -> list[str]:
    """The cached commits a revision names: a commit itself, or what refs/<revision> holds."""
    found = {os.path.basename(s) for s in _snapshots(cache) if os.path.basename(s) == revision}
    for ref in _refs(cache):
        if os.path.relpath(ref, os.path.join(cache.folder, "refs")) == revision:
            commit = _ref_commit(ref)
            if commit and os.path.lexists(os.path.join(cache.folder, "snapshots", commit)):
                found.add(commit)
    return sorted(found)


def _snapshots(cache: RepoCache) -> list[str]:
    folder = os.path.join(cache.folder, "snapshots")
    if os.path.islink(folder) or not os.path.isdir(folder):
        return []
    return [os.path.join(folder, name) for name in sorted(os.listdir(folder))]


def _refs(cache: RepoCache) -> list[str]:
    """The ref files, walked without following links."""
    folder = os.path.join(cache.folder, "refs")
    if os.path.islink(folder):
        return []
    return [path for path in _entries(folder) if not os.path.islink(path)]


def _ref_commit(path: str) -> str:
    try:
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
        with os.fdopen(os.open(path, flags), "rb") as file:
            return file.read(64).decode("ascii", "replace").strip()
    except OSError:
        return ""


def _linked_blobs(cache: RepoCache, snapshot: str) -> set[str]:
    """The entries of blobs/ that a snapshot's links name, by the link's own text (one
    step, never resolved further): a link that leads anywhere else names none."""
    if os.path.islink(snapshot) or not os.path.isdir(snapshot):
        return set()
    blobs = os.path.join(cache.folder, "blobs") + os.sep
    found: set[str] = set()
    for path in _entries(snapshot):
        if os.path.islink(path):
            target = os.path.normpath(os.path.join(os.path.dirname(path), os.readlink(path)))
            if target.startswith(blobs) and os.sep not in target[len(blobs) :]:
                found.add(target)
    return found


def _entries(folder: str) -> list[str]:
    """Every file and link under `folder` (links to folders included, not entered)."""
    found: list[str] = []
    for root, folders, files in os.walk(folder, followlinks=False):
        found += [os.path.join(root, name) for name in files]
        linked = [os.path.join(root, name) for name in folders]
        found += [path for path in linked if os.path.islink(path)]
    return found


def _freed_by_unlinking(path: str) -> int:
    """The bytes removing `path` gives back: a file's blocks when this is its last name;
    nothing for a link or a file with other names."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return 0
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        return 0
    return info.st_blocks * 512


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
