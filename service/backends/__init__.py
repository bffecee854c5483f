"""The backend registry: which library loads a model, chosen by its files."""

from __future__ import annotations

from service.backends.base import TextBackend
from service.errors import NotSupported
from service.models.catalog import ModelSpec
from service.models.sources import ModelSource


def load_text_backend(spec: ModelSpec, source: ModelSource) -> TextBackend:
    """Load an admitted model with the backend its files call for, on the worker thread."""
    if source.path is None:
        raise NotSupported(f"model {spec.name!r} is not on local disk")
    if source.kind == "gguf":
        from service.backends.llama_cpp import LlamaCppBackend, LlamaCppOptions

        options = LlamaCppOptions(context_size=spec.context_size, threads=spec.threads)
        return LlamaCppBackend(source.path, options)
    if source.kind == "checkpoint":
        from service.backends.mlx_lm import MlxLmBackend, MlxLmOptions

        return MlxLmBackend(source.path, MlxLmOptions(context_size=spec.context_size))
    raise NotSupported(f"model {spec.name!r}: no backend serves {source.describe()}")
