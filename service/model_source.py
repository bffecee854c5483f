"""Where a model's files are: the local path or hub reference a request resolved to."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

SourceKind = Literal["gguf", "checkpoint", "diffusers", "unknown"]


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
    # The file at `path` is these files joined, in order (an embedded model shipped in
    # chunks): `path` need not exist until the pool joins them (ModelSpec.prepare), once
    # admission has said the model fits; admission reads the chunks as one file.
    chunks: tuple[Path, ...] = ()

    @property
    def available_locally(self) -> bool:
        return self.path is not None

    def describe(self) -> str:
        return f"hf:{self.hub}" if self.hub else str(self.path)
