"""Where a model's files are: the local path or hub reference a request resolved to."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils._validators import validate_repo_id

from service.errors import InvalidRequest, excerpt

# The hub's own rule for a repo id (huggingface_hub.utils.validate_repo_id), in words.
_REPO_ID_MOST = 96
SourceKind = Literal["gguf", "checkpoint", "diffusers", "unknown"]


@dataclass(frozen=True)
class HubReference:
    """A repo on the hub, as a request named it. Made only with a repo id the hub library
    accepts: one it refuses (`a--b/c`, `a/b.`, a 100-character name) is INVALID_ARGUMENT
    here, naming the rule, never an error further in."""

    repo_id: str
    revision: str | None = None
    file: str | None = None  # a file name, or a quantization tag such as Q4_K_M

    def __post_init__(self) -> None:
        check_repo_id(self.repo_id)

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
    # The file at `path` is these files joined, in order (an embedded model shipped in
    # chunks): `path` need not exist until the pool joins them (ModelSpec.prepare), once
    # admission has said the model fits; admission reads the chunks as one file.
    chunks: tuple[Path, ...] = ()

    @property
    def available_locally(self) -> bool:
        return self.path is not None

    def describe(self) -> str:
        return f"hf:{self.hub}" if self.hub else str(self.path)


def check_repo_id(repo_id: str) -> str:
    """`repo_id` if huggingface_hub's validator accepts it; else InvalidRequest naming
    the rule it breaks."""
    try:
        validate_repo_id(repo_id)
    except HFValidationError:
        raise InvalidRequest(
            f"{excerpt(repo_id)} is not a Hugging Face repo id: {_broken_rule(repo_id)}",
            param="model",
        ) from None
    return repo_id


def _broken_rule(repo_id: str) -> str:
    if repo_id.count("/") > 1:
        return "it is owner/name, with one '/'"
    longest = max(len(part) for part in repo_id.split("/"))
    if longest > _REPO_ID_MOST:
        return f"its owner and its name are at most {_REPO_ID_MOST} characters each (not {longest})"
    if "--" in repo_id or ".." in repo_id:
        return "it may not hold '--' or '..'"
    if repo_id.endswith(".git"):
        return "it may not end in '.git'"
    return (
        "each part is letters, digits, '-', '_' and '.', and neither starts nor ends "
        "with '-' or '.'"
    )
