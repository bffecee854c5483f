"""What the hub cache holds, and removing a model from it.

huggingface_hub's own cache scanner reads the layout (the same one `hf cache
ls` shows); this adds the partial files of interrupted pulls to each repo.

A deletion is ours, not the scanner's plan (that one deletes whatever a
snapshot's links resolve to, and a link planted in a snapshot led it to
delete a file outside the cache). It removes exactly what was named:

- `owner/name`: the repo's folder, interrupted pulls included;
- `owner/name@REV`: that revision's snapshot (REV a commit, or a branch or tag
  whose ref file holds one), the refs naming it, and the blobs no other
  snapshot links to;
- `owner/name[@REV]:FILE`: that file of that revision (main if none is named),
  or the GGUF a quantization tag picks with its parts, and its blob if no other
  snapshot links to it; a name that matches nothing is refused.

A ref file is read as a 40-hex commit id, or the deletion is refused: its text
never becomes a path. Every folder is opened through directory descriptors
from the cache's root (service.hub.dirfd), never through a link, so a link
planted anywhere (the repo's folder, blobs/, a snapshot) or swapped in while
the deletion runs is removed as a link or refused, never followed; a blob is
deleted only as an entry of the repo's own blobs/ that a snapshot's link names
by its text, and "freed" counts only files whose last name went (what the file
system really gives back).
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import stat
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from huggingface_hub import CachedRepoInfo, scan_cache_dir

from service.errors import InvalidRequest, ModelNotFound, NotSupported, excerpt
from service.hub import dirfd
from service.hub.cache import COMMIT, OutsideCache, RepoCache, blob_named, ref_commit
from service.hub.files import SPLIT_GGUF, gguf_parts, pick_gguf
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
    """Delete what `hub` names: a repo (`owner/name`), one revision of it (`@REV`), or
    one file of a revision (`:FILE`, of main when no revision is named). The commits
    touched, and the bytes the file system gave back (files whose last name went)."""
    cache = RepoCache(cache_dir, hub.repo_id)
    _check_folder(cache, hub.repo_id)
    if hub.revision is None and hub.file is None:
        return _delete_repo(cache)
    _check_inner_folders(cache)
    commits = _commits_named(cache, hub.revision or "main")
    if not commits:
        raise ModelNotFound(
            f"the hub cache holds no revision {excerpt(hub.revision or 'main')} of "
            f"{excerpt(hub.repo_id)}"
        )
    if hub.file is not None:
        if len(commits) > 1:
            raise InvalidRequest(
                f"{excerpt(str(hub))}: the revision names {len(commits)} cached commits; "
                "name the file's commit with @COMMIT"
            )
        return commits, _delete_files(cache, commits[0], hub)
    return commits, sum(_delete_revision(cache, commit) for commit in commits)


def snapshot_folder(cache_dir: Path, hub: HubReference) -> str | None:
    """The folder whose files a deletion of `hub` removes: a revision's snapshot (for
    `:FILE` too), or the repo's folder (None if the revision is not cached)."""
    cache = RepoCache(cache_dir, hub.repo_id)
    if hub.revision is None and hub.file is None:
        return cache.folder
    try:
        commits = _commits_named(cache, hub.revision or "main")
    except (OSError, OutsideCache):
        return None  # the deletion itself says what is wrong
    return cache.path("snapshots", commits[0]) if len(commits) == 1 else None


def _check_folder(cache: RepoCache, repo_id: str) -> None:
    """The repo's folder is a folder inside the cache: a link is refused, not followed."""
    try:
        with cache.at():
            pass
    except (FileNotFoundError, NotADirectoryError):
        raise ModelNotFound(f"the hub cache holds no copy of {excerpt(repo_id)}") from None


def _check_inner_folders(cache: RepoCache) -> None:
    """blobs/, snapshots/ and refs/ are folders (or absent), not links: a deletion of
    part of a repo is refused before it removes anything if one is a link."""
    for name in ("blobs", "snapshots", "refs"):
        with contextlib.suppress(FileNotFoundError, NotADirectoryError), cache.at(name):
            pass


def _delete_repo(cache: RepoCache) -> tuple[list[str], int]:
    """The whole repo folder, interrupted pulls included; links inside it go as links."""
    commits = sorted(c for c in _snapshot_names(cache) if COMMIT.fullmatch(c))
    with cache.at_root() as root:
        freed = dirfd.remove_tree(root, cache.name)
    return commits, freed


def _delete_revision(cache: RepoCache, commit: str) -> int:
    """A snapshot, the refs naming it, and the blobs no other snapshot links to."""
    blobs = _linked_blobs(cache, commit)
    with cache.at("snapshots") as snapshots:
        freed = dirfd.remove_tree(snapshots, commit)  # a link goes as a link
    with contextlib.suppress(FileNotFoundError, NotADirectoryError), cache.at("refs") as refs:
        for fd, name, relative in dirfd.walk_files(refs):  # each fd open while its entry is
            if _ref_or_none(cache, fd, name, relative) == commit:
                dirfd.unlink(fd, name)
    return freed + _delete_unlinked_blobs(cache, blobs)


def _delete_files(cache: RepoCache, commit: str, hub: HubReference) -> int:
    """One file of a snapshot (or, for a quantization tag, the GGUF it picks, with its
    parts): the snapshot's entries, and their blobs if no other snapshot links to them."""
    assert hub.file is not None
    with cache.at("snapshots", commit) as snapshot:
        names = [relative for _, _, relative in dirfd.walk_files(snapshot)]
    doomed = _files_named(names, hub.file, str(hub))
    blobs: set[str] = set()
    freed = 0
    for name in doomed:
        *folders, base = dirfd.parts_of(name)
        with cache.at("snapshots", commit, *folders) as fd:
            blob = blob_named(dirfd.read_link(fd, base), 2 + len(folders))
            if blob is not None:
                blobs.add(blob)
            freed += dirfd.freed_by_unlinking(dirfd.entry(fd, base))
            dirfd.unlink(fd, base)
        _prune_empty(cache, commit, folders)
    return freed + _delete_unlinked_blobs(cache, blobs)


def _files_named(names: list[str], file: str, label: str) -> list[str]:
    """The snapshot's files `:FILE` names: that file exactly, else the GGUF a quantization
    tag picks (every part of a split one). Refused (NOT_FOUND, or INVALID_ARGUMENT when
    the tag is ambiguous) when nothing matches, so nothing else is deleted instead."""
    if file in names:
        return [file]
    try:
        first = pick_gguf(names, file, label)
    except ModelNotFound:
        raise ModelNotFound(
            f"{excerpt(label)}: the cached snapshot holds no file named {excerpt(file)}, "
            "nor a GGUF file whose name holds it; nothing was deleted"
        ) from None
    try:
        return gguf_parts(first, names)
    except ModelNotFound:  # a split GGUF with parts missing: the parts there are
        match = SPLIT_GGUF.match(posixpath.basename(first))
        assert match is not None
        prefix = posixpath.join(posixpath.dirname(first), match["prefix"])
        return [n for n in names if n.startswith(prefix) and SPLIT_GGUF.match(n)]


def _prune_empty(cache: RepoCache, commit: str, folders: list[str]) -> None:
    """The folders a deleted file lay in, deepest first, where nothing else is left."""
    for depth in range(len(folders), 0, -1):
        with cache.at("snapshots", commit, *folders[: depth - 1]) as fd:
            try:
                os.rmdir(folders[depth - 1], dir_fd=fd)
            except OSError:
                return  # not empty (or not there)


def _delete_unlinked_blobs(cache: RepoCache, blobs: set[str]) -> int:
    """The blobs of `blobs` no snapshot links to any more: entries of the repo's own
    blobs/ folder, opened by its descriptor (a link there goes as a link)."""
    still_linked: set[str] = set()
    for commit in _snapshot_names(cache):
        still_linked |= _linked_blobs(cache, commit)
    freed = 0
    with contextlib.suppress(FileNotFoundError, NotADirectoryError), cache.at("blobs") as fd:
        for blob in sorted(blobs - still_linked):
            info = dirfd.entry(fd, blob)
            if info is None or stat.S_ISDIR(info.st_mode):
                continue
            freed += dirfd.freed_by_unlinking(info)
            dirfd.unlink(fd, blob)
    return freed


def _commits_named(cache: RepoCache, revision: str) -> list[str]:
    """The cached commits a revision names: a commit itself, or what refs/<revision>
    holds (a ref that holds anything but a commit id is refused, never followed)."""
    snapshots = set(_snapshot_names(cache))
    found = {revision} if COMMIT.fullmatch(revision) and revision in snapshots else set()
    try:
        commit = cache.read_ref(revision)
    except InvalidRequest:  # not a name a ref file can have
        commit = None
    if commit is not None and commit in snapshots:
        found.add(commit)
    return sorted(found)


def _snapshot_names(cache: RepoCache) -> list[str]:
    try:
        with cache.at("snapshots") as fd:
            return dirfd.names(fd)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _ref_or_none(cache: RepoCache, fd: int, name: str, relative: str) -> str | None:
    """The commit a ref file holds, or None for one that holds something else."""
    try:
        return ref_commit(fd, name, cache.path("refs", relative))
    except NotSupported:
        return None


def _linked_blobs(cache: RepoCache, commit: str) -> set[str]:
    """The entries of blobs/ that a snapshot's links name, by the link's own text (one
    step, never resolved): a link that leads anywhere else names none."""
    found: set[str] = set()
    try:
        with cache.at("snapshots", commit) as snapshot:
            for fd, name, relative in dirfd.walk_files(snapshot):
                blob = blob_named(dirfd.read_link(fd, name), 2 + relative.count("/"))
                if blob is not None:
                    found.add(blob)
    except (FileNotFoundError, NotADirectoryError, OutsideCache):
        pass  # no snapshot folder there (a link to one is removed as a link)
    return found


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
