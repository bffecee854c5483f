"""Admission: can this build serve a model, and with which backend, before loading it.

`decide` reads metadata only (a GGUF header, a config.json, file sizes) and
asks each backend library whether it implements the architecture and can
decode the weight layout (see `gates`). The pool adds whether the model fits
in memory now: host memory, and GPU memory for the layers a CUDA build of
llama.cpp offloads.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from pathlib import Path

from inference.v1 import inference_pb2 as pb
from service.admission.describe import (
    ModelDescription,
    UnreadableModel,
    describe_checkpoint,
    describe_gguf,
    describe_pipeline,
)
from service.admission.gates import (
    DIFFUSERS,
    LLAMA_CPP,
    MLX_LM,
    diffusers_refusal,
    llama_cpp_offloads,
    llama_cpp_refusal,
    mlx_lm_refusal,
)
from service.memory import MemoryNeed, offloaded_share
from service.model_source import ModelSource


class Capability(enum.Enum):
    TEXT = pb.CAPABILITY_TEXT
    IMAGE = pb.CAPABILITY_IMAGE


@dataclass(frozen=True)
class Decision:
    admitted: bool
    reason: str
    backend: str = ""
    description: ModelDescription | None = None
    available_locally: bool = False
    # The backend's library can put layers on a GPU (a CUDA build of llama.cpp).
    offloads: bool = False

    def memory(
        self, context_size: int, gpu_layers: int = 0, sequences: int = 1, *, pooled: bool = False
    ) -> MemoryNeed:
        """Weights and KV cache (one, one per sequence, or one pool for all: see
        ModelDescription.memory_bytes), and the part of them on a GPU; zeros when
        nothing was read."""
        if self.description is None:
            return MemoryNeed()
        weights, kv_cache = self.description.memory_bytes(context_size, sequences, pooled=pooled)
        layers = self.description.layer_count
        share = offloaded_share(gpu_layers, layers) if self.offloads else 0.0
        return MemoryNeed.offloaded(weights, kv_cache, share)


def decide(source: ModelSource, capability: Capability, *, offline: bool) -> Decision:
    """Whether this build serves the model, from its metadata. A model whose metadata is
    broken is refused with the reason, never an error: it is the caller's bad model."""
    if source.path is None:
        return _not_cached(source, offline)
    if capability is Capability.IMAGE and source.kind != "diffusers":
        return Decision(False, f"{source.path.name} is a text model; call Generate", "", None, True)
    backend = {"diffusers": DIFFUSERS, "gguf": LLAMA_CPP}.get(source.kind, MLX_LM)
    try:
        return _decide_local(source.path, source.kind, capability)
    except UnreadableModel as exc:
        return Decision(False, str(exc), backend, None, available_locally=True)


def _decide_local(path: Path, kind: str, capability: Capability) -> Decision:
    if kind == "diffusers":
        description = describe_pipeline(path)
        if capability is not Capability.IMAGE:
            refusal = f"{path.name} is an image pipeline; call GenerateImage"
            return _verdict(DIFFUSERS, description, refusal)
        return _verdict(DIFFUSERS, description, diffusers_refusal(description))
    if kind == "gguf":
        description = describe_gguf(path)
        verdict = _verdict(LLAMA_CPP, description, llama_cpp_refusal(description))
        return dataclasses.replace(verdict, offloads=llama_cpp_offloads())
    description = describe_checkpoint(path)
    return _verdict(MLX_LM, description, mlx_lm_refusal(description))


def _verdict(backend: str, description: ModelDescription, refusal: str | None) -> Decision:
    if refusal is not None:
        return Decision(False, refusal, backend, description, available_locally=True)
    reason = f"{backend} serves {description.architecture} ({description.quantization.method})"
    return Decision(True, reason, backend, description, available_locally=True)


def _not_cached(source: ModelSource, offline: bool) -> Decision:
    where = f"the Hugging Face cache has no copy of {source.hub}"
    if offline:
        return Decision(False, f"{where}, and offline mode is on: download it first")
    return Decision(
        False,
        f"{where}; this build reads hub models from the cache only: "
        f"run `huggingface-cli download {source.hub.repo_id if source.hub else ''}` first",
    )
