"""Whether a backend can serve a model: asked of each library, not of a list.

Every gate has two halves, and both must pass:
- the architecture: does the library implement it? llama.cpp is asked by
  loading a probe file that names the architecture (a vocab-only load that
  fails in microseconds either at the architecture or, past it, at the missing
  vocabulary); mlx-lm by resolving the model module its own loader would
  import, with its own remapping tables.
- the layout: can the loader decode the weights as stored? llama.cpp's ggml
  says which tensor types it knows; mlx-lm decodes its own affine and
  block-scaled float modes, never a Hugging Face `quant_method` family
  (awq, gptq, bitsandbytes...), from which it would build garbage.

Each gate returns None when the model passes, else a reason a person can act on.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Mapping
from functools import cache, lru_cache
from typing import Any

from service.admission.describe import ModelDescription
from service.admission.ggml_types import type_problem
from service.admission.quantization import QuantScheme
from service.backends.names import DIFFUSERS, LLAMA_CPP, MLX_LM
from service.errors import excerpt
from service.scratch import memory_path

__all__ = ["DIFFUSERS", "LLAMA_CPP", "MLX_LM"]


# --- optional libraries -----------------------------------------------------------------

# The modules each extra of the package (pyproject.toml) brings, as imported. The text
# image and a plain `pip install inference-service` have none of them: a model that needs
# one is refused at admission, naming the extra, rather than failing when it is loaded.
EXTRA_MODULES = {
    "images": ("torch", "diffusers", "transformers", "PIL"),
    "mlx": ("mlx", "mlx_lm"),
}


def missing_extra(extra: str) -> str | None:
    """What to install, when a module of `extra` is missing; None when all are there."""
    absent = [name for name in EXTRA_MODULES[extra] if not _importable(name)]
    if not absent:
        return None
    return f"this build has no {', '.join(absent)}: install inference-service[{extra}]"


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent that fails, or a half-removed module
        return False


# --- llama.cpp --------------------------------------------------------------------------


def llama_cpp_refusal(description: ModelDescription) -> str | None:
    for ggml_type in sorted(description.tensor_types):
        problem = type_problem(ggml_type)
        if problem:
            return f"llama.cpp in this build cannot decode tensor type {ggml_type}: {problem}"
    if not description.architecture:
        return "the GGUF file names no general.architecture"
    if not llama_cpp_knows_architecture(description.architecture):
        return (
            f"llama.cpp in this build does not implement the architecture "
            f"{excerpt(description.architecture)}; a newer llama-cpp-python may"
        )
    # After the architecture: the hyper-parameters' keys are named after it.
    return description.defect or None


@cache
def llama_cpp_computes_on_gpu() -> bool:
    """Whether this build of llama.cpp can run layers on a GPU (CUDA, Metal, ...)."""
    import llama_cpp

    return bool(llama_cpp.llama_supports_gpu_offload())


def llama_cpp_offloads() -> bool:
    """Whether this build of llama.cpp puts layers in memory apart from the host's (CUDA).

    Apple GPUs share the host's memory, so layers offloaded through Metal still
    count against the host budget.
    """
    return llama_cpp_computes_on_gpu() and sys.platform != "darwin"


@lru_cache(maxsize=128)  # bounded: the name comes from whatever file was admitted
def llama_cpp_knows_architecture(architecture: str) -> bool:
    import gguf
    import llama_cpp

    from service.backends.llama_cpp.log import captured_native_log

    # In memory: a server with a read-only root and no writable /tmp admits models too.
    with memory_path("arch-probe.gguf") as probe:
        writer = gguf.GGUFWriter(probe, architecture)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        with captured_native_log() as log:
            model = llama_cpp.llama_model_load_from_file(str(probe).encode(), params)
    if model:  # cannot happen without a vocabulary, but never leak one
        llama_cpp.llama_model_free(model)
    return not any("unknown model architecture" in line for line in log)


# --- mlx-lm -----------------------------------------------------------------------------


def mlx_lm_refusal(description: ModelDescription) -> str | None:
    if description.defect:
        return description.defect
    quantization = description.quantization
    if quantization.scheme is QuantScheme.UNKNOWN_METHOD:
        return (
            f"the weights are packed with quant_method {quantization.method!r}, which mlx-lm "
            "cannot decode (it would build garbage from the packed tensors); use an "
            "unquantized checkpoint or one converted with mlx_lm.convert"
        )
    if quantization.scheme in (QuantScheme.GGUF_K_QUANT, QuantScheme.GGUF_BLOCK):
        return "GGUF layouts are served by llama.cpp, not mlx-lm"
    missing = missing_extra("mlx")
    if missing:
        return f"safetensors checkpoints are served by mlx-lm: {missing}"
    if not description.architecture:
        return "config.json names no model_type"
    module = mlx_lm_model_module(description.config)
    if module is None:
        return (
            f"mlx-lm in this build does not implement the architecture "
            f"{excerpt(description.architecture)}; a newer mlx-lm may"
        )
    return None


def mlx_lm_model_module(config: Mapping[str, Any]) -> str | None:
    """The module mlx-lm's loader would import for this config, if it exists."""
    from mlx_lm.utils import MODEL_ARCHITECTURE_REMAPPING, MODEL_REMAPPING

    model_type = str(config.get("model_type", "")).lower()
    architectures = config.get("architectures") or ()
    if isinstance(architectures, str):
        architectures = (architectures,)
    for architecture in architectures:
        remapped = MODEL_ARCHITECTURE_REMAPPING.get((model_type, str(architecture)))
        if remapped is not None:
            model_type = remapped
            break
    else:
        model_type = MODEL_REMAPPING.get(model_type, model_type)
    name = f"mlx_lm.models.{model_type}"
    if not model_type.isidentifier():  # "x.y" or "" would make find_spec import or raise
        return None
    return name if importlib.util.find_spec(name) is not None else None


# --- diffusers --------------------------------------------------------------------------


def diffusers_refusal(description: ModelDescription) -> str | None:
    if description.defect:
        return description.defect
    missing = missing_extra("images")
    if missing:
        return f"diffusers pipelines run on torch and diffusers: {missing}"
    if not description.architecture:
        return "model_index.json names no pipeline _class_name"
    if not diffusers_has_pipeline(description.architecture):
        return (
            f"diffusers in this build has no pipeline class {excerpt(description.architecture)}; "
            "a newer diffusers may, or map the model to the external image command"
        )
    return None


@lru_cache(maxsize=128)  # bounded: the name comes from whatever pipeline was admitted
def diffusers_has_pipeline(class_name: str) -> bool:
    import diffusers  # about 3 s the first time; admission runs off the event loop

    if not class_name.isidentifier():
        return False
    try:
        return isinstance(getattr(diffusers, class_name, None), type)
    except ImportError:  # a pipeline whose optional dependency this build lacks
        return False
