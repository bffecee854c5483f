"""The backend registry: the library that serves a model, as admission chose it."""

from __future__ import annotations

from service.admission.gates import DIFFUSERS, LLAMA_CPP, MLX_LM
from service.backends.base import TextBackend
from service.errors import NotSupported
from service.images.backend import ImageBackend
from service.models.catalog import ModelSpec
from service.models.sources import ModelSource


def load_backend(spec: ModelSpec, source: ModelSource, backend: str) -> TextBackend | ImageBackend:
    """Load an admitted model with `backend`; runs on the model's worker thread.

    Each library is imported here, on first use, so that the server starts
    without paying for libraries it may never need (torch takes seconds).
    """
    if source.path is None:
        raise NotSupported(f"model {spec.name!r} is not on local disk")
    if backend == LLAMA_CPP:
        from service.backends.llama_cpp import LlamaCppBackend, LlamaCppOptions

        options = LlamaCppOptions(
            context_size=spec.context_size,
            threads=spec.threads,
            gpu_layers=spec.gpu_layers,
            main_gpu=spec.main_gpu,
            flash_attention=spec.flash_attention,
            max_sequences=spec.parallel_sequences,
            cached_sequences=spec.cached_sequences,
            kv_layout=spec.kv_layout,
        )
        return LlamaCppBackend(source.path, options)
    if backend == MLX_LM:
        from service.backends.mlx_lm import MlxLmBackend, MlxLmOptions

        return MlxLmBackend(source.path, MlxLmOptions(context_size=spec.context_size))
    if backend == DIFFUSERS:
        from service.backends.diffusers_pipeline import DiffusersBackend, DiffusersOptions

        return DiffusersBackend(source.path, DiffusersOptions(threads=spec.threads))
    raise NotSupported(f"model {spec.name!r}: no backend named {backend!r} in this build")
