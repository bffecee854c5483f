"""The models this server knows by name: embedded defaults and configured ones."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from service.config import ModelConfig, Settings
from service.errors import ModelNotFound
from service.models.embedded import EMBEDDED_MODELS


@dataclass(frozen=True)
class ModelSpec:
    """Everything needed to load one model, resolved from settings."""

    name: str
    source: str
    locate: Callable[[], Path]
    context_size: int
    threads: int
    chat_template: str | None = None


class Catalog:
    def __init__(self, settings: Settings) -> None:
        self.default_model = settings.default_model
        self._specs: dict[str, ModelSpec] = {}
        for embedded in EMBEDDED_MODELS.values():
            self._specs[embedded.name] = ModelSpec(
                name=embedded.name,
                source=f"pypi:{embedded.package}",
                locate=embedded.locate,
                context_size=settings.context_size,
                threads=settings.threads,
            )
        for name, config in settings.models.items():
            self._specs[name] = _configured_spec(name, config, settings)

    def names(self) -> list[str]:
        return sorted(self._specs)

    def resolve(self, name: str) -> ModelSpec:
        """The spec for `name`; an empty name means the default model."""
        spec = self._specs.get(name or self.default_model)
        if spec is None:
            raise ModelNotFound(
                f"no model named {name!r}; this server has: {', '.join(self.names())}"
            )
        return spec


def _configured_spec(name: str, config: ModelConfig, settings: Settings) -> ModelSpec:
    path = config.path.expanduser()

    def locate() -> Path:
        if not path.is_file():
            raise ModelNotFound(f"model {name!r}: its file {path} does not exist")
        return path

    return ModelSpec(
        name=name,
        source=str(path),
        locate=locate,
        context_size=config.context_size or settings.context_size,
        threads=config.threads or settings.threads,
        chat_template=config.chat_template,
    )
