"""Turning a model reference into files on disk, inside the roots the operator allowed.

A reference is one of:
- a path to a .gguf file or a checkpoint directory (config.json, safetensors,
  tokenizer files), absolute or relative to a `--models-dir`;
- a Hugging Face repo, `owner/name[@revision][:file]`, where `file` names a
  .gguf file in the repo or a quantization tag (`:Q4_K_M`) that picks one.
  It is looked up in the standard hub cache (the one transformers uses).

References from requests are untrusted: they may only name files under the
models dirs or in the hub cache. `..`, symlinks leading out, and absolute
paths elsewhere are refused before anything is opened. The operator's own
configuration is trusted and may name any path.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal

from huggingface_hub import snapshot_download
from huggingface_hub.errors import LocalEntryNotFoundError

from service.errors import AccessDenied, InvalidRequest, ModelNotFound

SourceKind = Literal["gguf", "checkpoint", "diffusers", "unknown"]

_REPO_PART = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_HUB_REFERENCE = re.compile(
    rf"^(?P<repo>{_REPO_PART}/{_REPO_PART})(?:@(?P<revision>[A-Za-z0-9._/-]+?))?"
    r"(?::(?P<file>[A-Za-z0-9._/-]+))?$"
)


@dataclass(frozen=True)
class HubReference:
    repo_id: str
    revision: str | None = None
    file: str | None = None  # a file name, or a quantization tag such as Q4_K_M

    def __str__(self) -> str:
        text = self.repo_id
        if self.revision:
            text += f"@{self.revision}"
        return text + (f":{self.file}" if self.file else "")


@dataclass(frozen=True)
class ModelSource:
    kind: SourceKind
    # The .gguf file or checkpoint directory; None while a hub model is not in the cache.
    path: Path | None
    hub: HubReference | None = None

    @property
    def available_locally(self) -> bool:
        return self.path is not None

    def describe(self) -> str:
        return f"hf:{self.hub}" if self.hub else str(self.path)


class SourceResolver:
    def __init__(self, roots: Sequence[Path], hub_cache: Path) -> None:
        self._roots = [root.expanduser().resolve() for root in roots]
        self._hub_cache = hub_cache.expanduser().resolve()

    def resolve(self, reference: str, *, trusted: bool = False) -> ModelSource:
        if not reference or "\0" in reference:
            raise InvalidRequest("a model reference must be a non-empty string without NUL")
        path = Path(reference).expanduser() if trusted else Path(reference)
        if path.is_absolute():
            return self._local(self._checked_absolute(path, trusted))
        if any(part == ".." for part in PurePosixPath(reference).parts):
            raise AccessDenied(f"model reference {reference!r} may not contain '..'")
        for root in self._roots:
            candidate = root / reference
            if candidate.exists() or candidate.is_symlink():
                return self._local(self._inside(candidate.resolve(), root, reference))
        if trusted and path.exists():
            return self._local(path.resolve())
        match = _HUB_REFERENCE.match(reference)
        if match and not match["repo"].lower().endswith(".gguf"):  # a mistyped path
            hub = HubReference(match["repo"], match["revision"], match["file"])
            if hub.file and ".." in PurePosixPath(hub.file).parts:
                raise AccessDenied(f"model reference {reference!r} may not contain '..'")
            return self.from_hub_cache(hub)
        raise ModelNotFound(
            f"no model named {reference!r}, and no such file under the models dirs "
            f"({', '.join(map(str, self._roots)) or 'none configured: --models-dir'})"
        )

    def from_hub_cache(self, hub: HubReference) -> ModelSource:
        """The cached snapshot of a hub repo, or a source with no path if it is not cached."""
        try:
            snapshot = Path(
                str(
                    snapshot_download(
                        hub.repo_id,
                        revision=hub.revision,
                        cache_dir=self._hub_cache,
                        local_files_only=True,
                    )
                )
            )
        except LocalEntryNotFoundError:
            return ModelSource("unknown", None, hub)
        source = _classify(snapshot, hub.file, str(hub))
        return ModelSource(source.kind, source.path, hub)

    def _checked_absolute(self, path: Path, trusted: bool) -> Path:
        real = path.resolve()
        if trusted:
            return real
        for root in [*self._roots, self._hub_cache]:
            if real.is_relative_to(root):
                return real
        raise AccessDenied(
            f"{path} is outside the directories this server may read models from; "
            "name a path under a --models-dir instead"
        )

    def _inside(self, real: Path, root: Path, reference: str) -> Path:
        if not real.is_relative_to(root):
            raise AccessDenied(f"model reference {reference!r} leads outside {root} (a symlink)")
        return real

    def _local(self, path: Path) -> ModelSource:
        if not path.exists():
            raise ModelNotFound(f"{path} does not exist")
        return _classify(path, None, str(path))


def _classify(path: Path, file: str | None, label: str) -> ModelSource:
    """What kind of model a file or directory holds."""
    if path.is_file():
        if path.suffix.lower() == ".gguf":
            return ModelSource("gguf", path)
        raise InvalidRequest(f"{label}: expected a .gguf file or a checkpoint directory")
    if file is not None:
        return ModelSource("gguf", _pick_gguf(path, file, label))
    if (path / "model_index.json").is_file():
        return ModelSource("diffusers", path)
    if (path / "config.json").is_file():
        return ModelSource("checkpoint", path)
    ggufs = sorted(path.rglob("*.gguf"))
    if len(ggufs) == 1:
        return ModelSource("gguf", ggufs[0])
    if ggufs:
        names = ", ".join(str(g.relative_to(path)) for g in ggufs)
        raise InvalidRequest(f"{label} holds several GGUF files; name one with :FILE ({names})")
    raise InvalidRequest(
        f"{label} holds no model: expected a .gguf file, a config.json or a model_index.json"
    )


def _pick_gguf(directory: Path, file: str, label: str) -> Path:
    """A file named exactly, or the one GGUF whose name carries the tag (Q4_K_M)."""
    exact = directory / file  # `file` has no '..' (checked when parsed)
    if exact.is_file():
        return exact
    tag = file.lower()
    matches = [g for g in sorted(directory.rglob("*.gguf")) if tag in g.name.lower()]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise ModelNotFound(f"{label}: no GGUF file matching {file!r} in the cached snapshot")
    names = ", ".join(g.name for g in matches)
    raise InvalidRequest(f"{label}: {file!r} matches several files ({names}); name one")
