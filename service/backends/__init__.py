"""The backend registry: which library loads a model, chosen by its files."""

from __future__ import annotations

from service.backends.base import TextBackend
from service.errors import NotSupported
from service.models.catalog import ModelSpec


def load_text_backend(spec: ModelSpec) -> TextBackend:
    """Load `spec` with the backend its weights call for. Runs on the worker thread."""
    path = spec.locate()
    if path.suffix.lower() == ".gguf":
        from service.backends.llama_cpp import LlamaCppBackend, LlamaCppOptions

        options = LlamaCppOptions(context_size=spec.context_size, threads=spec.threads)
        return LlamaCppBackend(path, options)
    raise NotSupported(f"model {spec.name!r}: no backend serves {path.name} (expected a .gguf)")
