"""Turning a model reference into files on disk, inside the roots the operator allowed.

A reference is one of:
- a path to a .gguf file or a checkpoint directory (config.json, safetensors,
  tokenizer files), absolute or relative to a `--models-dir`;
- a Hugging Face repo, `owner/name[@revision][:file]`, where `file` names a
  .gguf file in the repo or a quantization tag (`:Q4_K_M`) that picks one.
  It is looked up in the standard hub cache (the one transformers uses).

References from requests are untrusted. Every path one leads to is walked by
`confine.find` inside its root (a models dir, or the hub cache, whose snapshots
are symlinks into its blobs/) before anything is opened: `..`, symlinks leading
out, and absolute paths elsewhere are PERMISSION_DENIED, with the same answer
whether or not anything exists outside. A directory is walked whole, within
bounds, and every entry a loader may read must stay inside too. Names are at
most MAX_MODEL_NAME_LENGTH characters. The operator's own configuration is
trusted and may name any path.
"""

from __future__ import annotations

import errno
import os
import posixpath
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from huggingface_hub import snapshot_download
from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError
from huggingface_hub.file_download import repo_folder_name

from service.errors import AccessDenied, InvalidRequest, ModelNotFound, ServiceError, excerpt
from service.hub.files import SPLIT_GGUF, is_first_part, some_names
from service.model_source import HubReference, ModelSource, SourceKind
from service.models import confine
from service.models.confine import Found, LeadsOutside, TooLarge

# Long enough for any path under a models dir and any `owner/name@revision:file`
# reference, short enough that a name costs nothing to check or to quote.
MAX_MODEL_NAME_LENGTH = 1024

_REPO_PART = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_HUB_REFERENCE = re.compile(
    rf"^(?P<repo>{_REPO_PART}/{_REPO_PART})(?:@(?P<revision>[A-Za-z0-9._/-]+?))?"
    r"(?::(?P<file>[A-Za-z0-9._/-]+))?$"
)
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_model_name(name: str) -> None:
    """Refuse a name no model can have, before any lookup, file system call or log line."""
    if len(name) > MAX_MODEL_NAME_LENGTH:
        raise InvalidRequest(
            f"a model name may be at most {MAX_MODEL_NAME_LENGTH} characters; got {excerpt(name)}"
        )
    if _CONTROL.search(name):
        raise InvalidRequest(f"a model name may not hold control characters: {excerpt(name)}")


@dataclass(frozen=True)
class _Root:
    """An allowed directory: its real path, and the spelling the operator gave it."""

    real: str
    given: str
    what: str  # for messages: "the models dir /srv/models"

    @classmethod
    def of(cls, path: Path, what: str) -> _Root:
        given = os.path.abspath(path.expanduser())
        real = os.path.realpath(given)
        return cls(real, given, f"{what} {real}")

    @property
    def confined(self) -> bool:
        return self.real != "/"

    def relative(self, absolute: str) -> str | None:
        """`absolute` relative to this root, when it is spelled as lying under it."""
        for spelling in (self.real, self.given):
            if confine.within(absolute, spelling):
                return absolute[len(spelling) :]
        return None


# Trusted references may lead anywhere: their root is the whole file system.
_ANYWHERE = _Root("/", "/", "the file system")


class SourceResolver:
    def __init__(self, roots: Sequence[Path], hub_cache: Path) -> None:
        self._roots = [_Root.of(root, "the models dir") for root in roots]
        self._hub = _Root.of(hub_cache, "the hub cache")

    def resolve(self, reference: str, *, trusted: bool = False) -> ModelSource:
        check_model_name(reference)
        if not reference:
            raise InvalidRequest("a model reference must be a non-empty string")
        with _filesystem_errors(reference):
            return self._trusted(reference) if trusted else self._untrusted(reference)

    def canonical_name(self, source: ModelSource, reference: str) -> str:
        """One name per model, however a request spelled it: a hub model by its parsed
        reference; a file or directory by its real path relative to the allowed root
        holding it (`x.gguf`, `./x.gguf`, `x.gguf/.` and `/srv/models/x.gguf` are one
        model, with one engine and one set of metric labels)."""
        if source.hub is not None:
            return str(source.hub)
        if source.path is None:
            return reference
        real = os.path.realpath(source.path)
        for root in [*self._roots, self._hub]:
            relative = root.relative(real)
            if relative is not None:
                return relative.lstrip("/") or reference
        return real

    def from_hub_cache(self, hub: HubReference, *, trusted: bool = False) -> ModelSource:
        """The cached snapshot of a hub repo, or a source with no path if it is not cached."""
        root = _ANYWHERE if trusted else self._hub
        label = str(hub)
        self._check_hub_reference(hub, root, label)
        try:
            snapshot = snapshot_download(
                hub.repo_id, revision=hub.revision, cache_dir=self._hub.real, local_files_only=True
            )
        except LocalEntryNotFoundError:
            return ModelSource("unknown", None, hub)
        except HFValidationError:
            raise InvalidRequest(f"{excerpt(label)} is not a valid Hugging Face repo id") from None
        found = _find_absolute(root, os.path.abspath(str(snapshot)), label)
        if found is None or not found.is_dir or not _holds_a_model(found.path):
            return ModelSource("unknown", None, hub)  # not there, or a pull has not finished
        if hub.file is not None:
            try:
                return ModelSource("gguf", _pick_gguf(root, found.path, hub.file, label), hub)
            except ModelNotFound:  # that file is not (yet) in the snapshot
                return ModelSource("unknown", None, hub)
        return replace(_directory(root, found.path, label), hub=hub)

    def _untrusted(self, reference: str) -> ModelSource:
        _refuse_parent_steps(reference)
        if reference.startswith("/"):
            return self._absolute(reference)
        for root in self._roots:
            found = _find(root, root.real, reference, reference)
            if found is not None:
                return _local(root, found, reference)
        return self._hub_or_missing(reference, trusted=False)

    def _trusted(self, reference: str) -> ModelSource:
        path = Path(reference).expanduser()
        if path.is_absolute():
            found = _find_absolute(_ANYWHERE, str(path), reference)
            if found is None:
                raise ModelNotFound(f"{excerpt(reference)} does not exist")
            return _local(_ANYWHERE, found, reference)
        _refuse_parent_steps(reference)
        for root in self._roots:
            found = _find(_ANYWHERE, root.real, reference, reference)
            if found is not None:
                return _local(_ANYWHERE, found, reference)
        found = _find_absolute(_ANYWHERE, os.path.abspath(path), reference)
        if found is not None:
            return _local(_ANYWHERE, found, reference)
        return self._hub_or_missing(reference, trusted=True)

    def _absolute(self, reference: str) -> ModelSource:
        path = posixpath.normpath(reference)
        for root in [*self._roots, self._hub]:
            relative = root.relative(path)
            if relative is None:
                continue
            found = _find(root, root.real, relative, reference)
            if found is None:
                raise ModelNotFound(f"{excerpt(reference)} does not exist")
            return _local(root, found, reference)
        raise AccessDenied(
            f"{excerpt(reference)} is outside the directories this server may read models "
            "from; name a path under a --models-dir instead"
        )

    def _hub_or_missing(self, reference: str, *, trusted: bool) -> ModelSource:
        match = _HUB_REFERENCE.match(reference)
        if match and not match["repo"].lower().endswith(".gguf"):  # else a mistyped path
            hub = HubReference(match["repo"], match["revision"], match["file"])
            return self.from_hub_cache(hub, trusted=trusted)
        dirs = ", ".join(root.real for root in self._roots) or "none configured: --models-dir"
        raise ModelNotFound(
            f"no model named {excerpt(reference)}, and no such file under the models dirs ({dirs})"
        )

    def _check_hub_reference(self, hub: HubReference, root: _Root, label: str) -> None:
        """The revision and file may not climb out; the ref the revision names stays inside.

        huggingface_hub reads `refs/<revision>` (or `snapshots/<commit>`) of the
        repo's folder before we see the snapshot, so that lookup is walked first.
        """
        for part in (hub.revision, hub.file):
            if part is not None and (part.startswith("/") or ".." in part.split("/")):
                raise AccessDenied(
                    f"model reference {excerpt(label)}: a revision or file must be a path "
                    "inside the repo (no leading '/', no '..')"
                )
        revision = hub.revision or "main"
        where = "snapshots" if _COMMIT.match(revision) else "refs"
        folder = repo_folder_name(repo_id=hub.repo_id, repo_type="model")
        _find_absolute(root, f"{self._hub.real}/{folder}/{where}/{revision}", label)


def hub_reference(reference: str) -> HubReference | None:
    """`owner/name[@revision][:file]` as a hub reference; None if it is not one."""
    check_model_name(reference)
    match = _HUB_REFERENCE.match(reference)
    if match is None or ".." in reference.split("/") or (match["revision"] or "").startswith("/"):
        return None
    return HubReference(match["repo"], match["revision"], match["file"])


def _refuse_parent_steps(reference: str) -> None:
    if ".." in reference.split("/"):
        raise AccessDenied(f"model reference {excerpt(reference)} may not contain '..'")


def _find(root: _Root, start: str, relative: str, label: str, entry: str = "") -> Found | None:
    """confine.find, with leaving the root turned into PERMISSION_DENIED.

    The message names what the client asked for (`entry`, inside the model's
    directory, when it is one of its files), never where a symlink points.
    """
    try:
        return confine.find(root.real, start, relative)
    except LeadsOutside:
        raise _leads_outside(root, label, entry) from None


def _leads_outside(root: _Root, label: str, entry: str = "") -> AccessDenied:
    inner = f": {excerpt(entry)}" if entry else ""
    return AccessDenied(
        f"model reference {excerpt(label)}{inner} leads outside {root.what} (a symlink); "
        "a request may only name files inside it"
    )


def _find_absolute(root: _Root, absolute: str, label: str) -> Found | None:
    """An absolute path the hub cache's own lookups produce, walked inside `root`."""
    relative = root.relative(absolute)
    if relative is None:
        raise _leads_outside(root, label)
    return _find(root, root.real, relative, label)


def _local(root: _Root, found: Found, label: str) -> ModelSource:
    """A file or directory a reference named, already found inside `root`."""
    if found.is_dir:
        return _directory(root, found.path, label)
    if not found.is_file:
        raise InvalidRequest(f"{excerpt(label)} is neither a regular file nor a directory")
    if not (found.path.lower().endswith(".gguf") or label.lower().endswith(".gguf")):
        raise InvalidRequest(f"{excerpt(label)}: expected a .gguf file or a checkpoint directory")
    directory, name = os.path.split(found.path)
    _check_split_parts(root, directory, name, label)
    return ModelSource("gguf", Path(found.path))


def _directory(root: _Root, directory: str, label: str) -> ModelSource:
    """What kind of model a directory holds; every entry must stay inside the root."""
    kind = _marked_kind(root, directory, label)
    if kind is not None and not root.confined:
        return ModelSource(kind, Path(directory))  # trusted: nothing to check
    entries = _survey(root, directory, label)
    if kind is not None:
        return ModelSource(kind, Path(directory))
    return ModelSource("gguf", Path(_only_gguf(root, directory, entries, label)))


_MARKERS: tuple[tuple[str, SourceKind], ...] = (
    ("model_index.json", "diffusers"),
    ("config.json", "checkpoint"),
)


def _marked_kind(root: _Root, directory: str, label: str) -> SourceKind | None:
    for marker, kind in _MARKERS:
        found = _find(root, directory, marker, label, marker)
        if found is not None and found.is_file:
            return kind
    return None


def _survey(root: _Root, directory: str, label: str) -> list[tuple[str, Found]]:
    """A directory's entries, refused whole if any leads outside `root` or it is too big."""
    try:
        found = confine.survey(root.real, directory)
    except TooLarge:
        raise InvalidRequest(
            f"{excerpt(label)} holds more than {confine.MAX_ENTRIES} entries or is deeper than "
            f"{confine.MAX_DEPTH} levels, too many to look through for a request; name the "
            "model's own file or directory, or have the operator configure it"
        ) from None
    if found.outside:
        raise _leads_outside(root, label, found.outside[0])
    odd = [name for name, entry in found.entries if not (entry.is_file or entry.is_dir)]
    if odd:
        raise InvalidRequest(
            f"{excerpt(label)}: {excerpt(odd[0])} is neither a regular file nor a directory"
        )
    return found.entries


def _ggufs(entries: list[tuple[str, Found]]) -> list[str]:
    """The GGUF files a model can be loaded from: a split one's later parts are not."""
    return [
        name
        for name, entry in entries
        if name.lower().endswith(".gguf") and entry.is_file and is_first_part(name)
    ]


def _only_gguf(root: _Root, directory: str, entries: list[tuple[str, Found]], label: str) -> str:
    """The one GGUF file under a directory with no config.json or model_index.json."""
    names = _ggufs(entries)
    if not names:
        raise InvalidRequest(
            f"{excerpt(label)} holds no model: expected a .gguf file, a config.json "
            "or a model_index.json"
        )
    if len(names) > 1:
        raise InvalidRequest(
            f"{excerpt(label)} holds several GGUF files; name one with :FILE or its path "
            f"({some_names(names)})"
        )
    real = _gguf_inside(root, directory, names[0], label)
    # A split file under its own name, not the hash of the blob it may link to:
    # llama.cpp finds the other parts by that name.
    return os.path.join(directory, names[0]) if SPLIT_GGUF.match(names[0]) else real


def _holds_a_model(snapshot: str) -> bool:
    """Whether a cached snapshot has what makes it a model. A pull fetches a
    checkpoint's config.json and a pipeline's model_index.json last, so a snapshot
    still being filled (or left by a cancelled pull) holds neither."""
    try:
        names = os.listdir(snapshot)
    except OSError:
        return False
    return any(
        name.endswith(".gguf") or name in ("config.json", "model_index.json") for name in names
    )


def _pick_gguf(root: _Root, directory: str, file: str, label: str) -> Path:
    """A file named exactly, or the one GGUF whose name carries the tag (Q4_K_M).

    The path returned is the one under the snapshot: its name is the file's,
    where the blob it links to has a hash for a name.
    """
    exact = _find(root, directory, file, label, file)
    if exact is not None and exact.is_file:
        _check_split_parts(root, directory, file, label)
        return Path(directory, file)
    tag = file.lower()
    names = [n for n in _ggufs(_survey(root, directory, label)) if tag in n.lower()]
    if not names:
        raise ModelNotFound(
            f"{excerpt(label)}: no GGUF file matching {excerpt(file)} in the cached snapshot"
        )
    if len(names) > 1:
        raise InvalidRequest(
            f"{excerpt(label)}: {excerpt(file)} matches several files "
            f"({some_names(names)}); name one"
        )
    _gguf_inside(root, directory, names[0], label)
    return Path(directory, names[0])


def _gguf_inside(root: _Root, directory: str, name: str, label: str) -> str:
    """The real path of a GGUF found by a survey, with its split parts checked."""
    found = _find(root, directory, name, label, name)
    assert found is not None  # the survey just saw it
    parent, base = os.path.split(found.path)
    _check_split_parts(root, parent, base, label)
    return found.path


def _check_split_parts(root: _Root, directory: str, name: str, label: str) -> None:
    """The other files of a split GGUF, which llama.cpp opens beside it, stay inside too."""
    match = SPLIT_GGUF.match(posixpath.basename(name))
    if match is None or not root.confined:
        return
    count = int(match["count"])
    if count > confine.MAX_ENTRIES:
        raise InvalidRequest(f"{excerpt(label)}: a GGUF split in {count} parts is too many")
    prefix = posixpath.join(posixpath.dirname(name), match["prefix"])
    for part in range(1, count + 1):
        sibling = f"{prefix}-{part:05d}-of-{count:05d}.gguf"
        _find(root, directory, sibling, label, sibling)


@contextmanager
def _filesystem_errors(reference: str) -> Iterator[None]:
    """What the file system refuses on a client's path is the client's problem, said clearly."""
    try:
        yield
    except ServiceError:
        raise
    except OSError as exc:
        raise _status_for(exc, reference) from None


def _status_for(exc: OSError, reference: str) -> ServiceError:
    quoted = excerpt(reference)
    if exc.errno == errno.ENAMETOOLONG:
        return InvalidRequest(f"{quoted}: a name in it is longer than the file system allows")
    if exc.errno == errno.ELOOP:
        return InvalidRequest(f"{quoted}: too many levels of symbolic links")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return AccessDenied(
            f"{quoted}: the server is not allowed to read it; make it readable by this "
            f"server's user (uid {os.getuid()}, gid {os.getgid()}), or in Kubernetes set the "
            "pod's securityContext.fsGroup"
        )
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return ModelNotFound(f"{quoted} does not exist")
    name = errno.errorcode.get(exc.errno or 0, "an error")
    return InvalidRequest(f"{quoted} cannot be read ({name})")
