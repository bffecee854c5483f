"""Loading a model with its library, as admission chose it: the engine's backend registry."""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING

from service.backends.base import TextBackend
from service.backends.names import DIFFUSERS, LLAMA_CPP, MLX_LM
from service.embeddings.backend import EmbeddingBackend
from service.engine.model_options import ModelOptions
from service.engine.options import EngineOptions
from service.errors import NotSupported
from service.images.backend import ImageBackend

if TYPE_CHECKING:
    from service.backends.llama_cpp import LlamaCppOptions


def load_backend(options: EngineOptions) -> TextBackend | ImageBackend | EmbeddingBackend:
    """Load an admitted model with its backend; runs on the model's worker thread.

    Each library is imported here, on first use, so that the server starts
    without paying for libraries it may never need (torch takes seconds).
    """
    if options.embeddings:
        from service.backends.llama_cpp.embedder import EmbedderOptions, LlamaCppEmbedder

        model = options.model
        return LlamaCppEmbedder(
            options.path, EmbedderOptions(model.threads, model.gpu_layers, model.main_gpu)
        )
    if options.backend == LLAMA_CPP:
        from service.backends.llama_cpp import LlamaCppBackend

        return LlamaCppBackend(options.path, llama_cpp_options(options.model))
    if options.backend == MLX_LM:
        from service.backends.mlx_lm import MlxLmBackend, MlxLmOptions

        return MlxLmBackend(options.path, MlxLmOptions(context_size=options.model.context_size))
    if options.backend == DIFFUSERS:
        from service.backends.diffusers_pipeline import DiffusersBackend, DiffusersOptions

        return DiffusersBackend(options.path, DiffusersOptions(threads=options.model.threads))
    raise NotSupported(
        f"model {options.name!r}: no backend named {options.backend!r} in this build"
    )


def llama_cpp_options(model: ModelOptions) -> LlamaCppOptions:
    """A model's options for llama.cpp (`max_sequences` is its parallel_sequences; the
    prefill chunk keeps its default). Here rather than in the backend, so
    that the backends need nothing of the model options above them."""
    from service.backends.llama_cpp import LlamaCppOptions

    shared = {field.name for field in fields(LlamaCppOptions)} & {
        field.name for field in fields(model)
    }
    return LlamaCppOptions(
        max_sequences=model.parallel_sequences,
        **{name: getattr(model, name) for name in shared},
    )
