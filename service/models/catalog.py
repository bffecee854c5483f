"""The models this server knows: embedded defaults, configured names, and references.

A request's `model` is a configured name (or empty, for the default), else a
reference resolved under the operator's rules (see `sources`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from service.config import ModelConfig, Settings
from service.engine.model_options import ModelOptions
from service.model_source import ModelSource
from service.models.embedded import EMBEDDED_MODELS, EmbeddedModel
from service.models.sources import SourceResolver, check_model_name
from service.models.unjoined import UNJOINED, join


@dataclass(frozen=True)
class ModelSpec:
    """Everything needed to load one model."""

    name: str
    label: str  # where it comes from, for people: a path, hf:owner/repo, pypi:package
    locate: Callable[[], ModelSource]
    options: ModelOptions
    chat_template: str | None = None
    configured: bool = True
    source: str = ""  # the reference as configured or requested
    backend: str = "auto"  # or names.EXTERNAL: images come from the external command
    base_model: str = "dev"
    embeds: bool = False  # known to be an embedding model before it is loaded
    # What makes the located files loadable, and the source to load: joining an embedded
    # model's chunks (service.models.unjoined). The pool runs it only once admission has
    # said the model fits and its memory is reserved, so a refused model writes nothing.
    prepare: Callable[[], ModelSource] | None = None


def _nowhere() -> ModelSource:
    raise AssertionError("the defaults template names no model")


class Catalog:
    def __init__(self, settings: Settings, resolver: SourceResolver) -> None:
        self.default_model = settings.default_model
        self._settings = settings
        self._resolver = resolver
        # What the server's settings give every model; each spec replaces the rest.
        self._defaults = ModelSpec(
            name="",
            label="",
            locate=_nowhere,
            options=ModelOptions.from_settings(settings),
        )
        self._specs: dict[str, ModelSpec] = {}
        for embedded in EMBEDDED_MODELS.values():
            self._specs[embedded.name] = self._embedded_spec(embedded)
        for name, config in settings.models.items():
            self._specs[name] = self._configured_spec(name, config)

    def names(self) -> list[str]:
        return sorted(self._specs)

    def configured(self, name: str) -> ModelSpec | None:
        """The spec of a configured name (empty: the default); None for anything else."""
        check_model_name(name)
        return self._specs.get(name or self.default_model)

    def resolve(self, name: str) -> ModelSpec:
        """The spec for a configured name (empty: the default) or a model reference."""
        check_model_name(name)  # before a dict lookup, a path or a log line sees it
        spec = self._specs.get(name or self.default_model)
        if spec is not None:
            return spec
        source = self._resolver.resolve(name)  # refuses paths outside the allowed roots
        return replace(
            self._defaults,
            name=self._resolver.canonical_name(source, name),
            label=source.describe(),
            locate=lambda: source,
            configured=False,
            source=name,
        )

    def _embedded_spec(self, embedded: EmbeddedModel) -> ModelSpec:
        spec = replace(
            self._defaults,
            name=embedded.name,
            label=f"pypi:{embedded.package}",
            locate=lambda: ModelSource("gguf", embedded.locate()),
            embeds=embedded.embeds,
        )
        chunks = UNJOINED.get(embedded.name)
        if chunks is None:
            return spec

        def unjoined() -> ModelSource:
            """Its chunks while they are not joined: admission reads them, writing nothing."""
            return chunks() or join(embedded)

        return replace(spec, locate=unjoined, prepare=lambda: join(embedded))

    def _configured_spec(self, name: str, config: ModelConfig) -> ModelSpec:
        defaults = self._defaults
        return replace(
            defaults,
            name=name,
            label=config.source,
            locate=lambda: self._resolver.resolve(config.source, trusted=True),
            options=defaults.options.with_overrides(config),
            chat_template=config.chat_template,
            source=config.source,
            backend=config.backend,
            base_model=config.base_model,
        )
