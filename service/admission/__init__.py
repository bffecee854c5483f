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
import posixpath
from dataclasses import dataclass
from pathlib import Path

from inference.v1 import inference_pb2 as pb
from service.admission.describe import (
    ModelDescription,
    UnreadableModel,
    describe_checkpoint,
    describe_gguf,
    describe_joined_gguf,
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
from service.admission.hub import read_remote
from service.backends.names import LLAMA_CPP_EMBEDDINGS
from service.hub.client import HubAccess
from service.hub.download import Download
from service.hub.files import SPLIT_GGUF
from service.memory import MemoryNeed, offloaded_share
from service.model_source import HubReference, ModelSource


class Capability(enum.Enum):
    TEXT = pb.CAPABILITY_TEXT
    IMAGE = pb.CAPABILITY_IMAGE
    EMBED = pb.CAPABILITY_EMBED


@dataclass(frozen=True)
class Decision:
    admitted: bool
    reason: str
    backend: str = ""
    description: ModelDescription | None = None
    available_locally: bool = False
    # The backend's library can put layers on a GPU (a CUDA build of llama.cpp).
    offloads: bool = False
    # A hub model not on disk yet: what a download would take.
    download: Download | None = None

    def memory(
        self,
        context_size: int,
        gpu_layers: int = 0,
        sequences: int = 1,
        *,
        pooled: bool = False,
        batch_size: int = 0,
    ) -> MemoryNeed:
        """Weights and KV cache (one, one per sequence, or one pool for all: see
        ModelDescription.memory_bytes), and the part of them on a GPU; zeros when
        nothing was read. With every layer on the GPU, also llama.cpp's compute buffer
        for steps of `batch_size` tokens, which CUDA reserves whole at load (a partly
        offloaded model's is split between the devices, and not estimated)."""
        if self.description is None:
            return MemoryNeed()
        weights, kv_cache = self.description.memory_bytes(context_size, sequences, pooled=pooled)
        layers = self.description.layer_count
        share = offloaded_share(gpu_layers, layers) if self.offloads else 0.0
        compute = self.description.compute_bytes(batch_size) if share >= 1.0 else 0
        return MemoryNeed.offloaded(weights, kv_cache, share, compute)


def decide(
    source: ModelSource,
    capability: Capability,
    *,
    offline: bool,
    hub: HubAccess | None = None,
    hub_cache: Path | None = None,
) -> Decision:
    """Whether this build serves the model, from its metadata. A model whose metadata is
    broken is refused with the reason, never an error: it is the caller's bad model.

    A hub model that is not in the cache is judged from the hub's metadata (`hub`,
    unless offline); the hub's own refusals (no such repo, gated) are errors."""
    if source.path is None:
        if offline or hub is None or source.hub is None:
            return _not_cached(source, offline)
        return _decide_remote(source.hub, capability, hub, hub_cache or Path("."))
    if capability is Capability.IMAGE and source.kind != "diffusers":
        return Decision(False, f"{source.path.name} is a text model; call Generate", "", None, True)
    backend = {"diffusers": DIFFUSERS, "gguf": LLAMA_CPP}.get(source.kind, MLX_LM)
    try:
        description = _describe_local(source.path, source.kind, source.chunks)
    except UnreadableModel as exc:
        return Decision(False, str(exc), backend, None, available_locally=True)
    return _decide_described(source.kind, description, capability, source.path.name)


def _describe_local(path: Path, kind: str, chunks: tuple[Path, ...] = ()) -> ModelDescription:
    if chunks:  # not joined yet: nothing is written before the model is known to fit
        return describe_joined_gguf(chunks, path.name)
    if kind == "diffusers":
        return describe_pipeline(path)
    if kind == "gguf":
        return describe_gguf(path)
    return describe_checkpoint(path)


def _decide_described(
    kind: str, description: ModelDescription, capability: Capability, name: str
) -> Decision:
    if kind == "diffusers":
        if capability is not Capability.IMAGE:
            refusal = f"{name} is an image pipeline; call GenerateImage"
            return _verdict(DIFFUSERS, description, refusal)
        return _verdict(DIFFUSERS, description, diffusers_refusal(description))
    if capability is Capability.IMAGE:
        return Decision(False, f"{name} is a text model; call Generate", "", None, True)
    if kind == "gguf":
        problem = _task_refusal(description, capability, name) or llama_cpp_refusal(description)
        backend = LLAMA_CPP_EMBEDDINGS if description.pooling else LLAMA_CPP
        verdict = _verdict(backend, description, problem)
        return dataclasses.replace(verdict, offloads=llama_cpp_offloads())
    if capability is Capability.EMBED:
        refused = f"{name} generates text; embeddings are served from GGUF embedding models"
        return _verdict(MLX_LM, description, refused)
    return _verdict(MLX_LM, description, mlx_lm_refusal(description))


def _decide_remote(
    hub: HubReference, capability: Capability, access: HubAccess, hub_cache: Path
) -> Decision:
    remote = read_remote(hub, access, hub_cache)
    download = remote.download
    backend = {"diffusers": DIFFUSERS, "gguf": LLAMA_CPP}.get(remote.kind, MLX_LM)
    if remote.description is None:
        decision = Decision(False, remote.problem, backend if remote.kind != "unknown" else "")
    else:
        decision = _decide_described(remote.kind, remote.description, capability, str(hub))
    reason = decision.reason
    if decision.admitted:
        files = len(download.files)
        reason += (
            f"; not on local disk yet: a download of {download.total_bytes} bytes "
            f"({files} file{'s' if files != 1 else ''})"
        )
        if not download.fits_on_disk:
            reason += f", more than the {download.free_bytes} bytes free for the hub cache"
    return dataclasses.replace(decision, reason=reason, available_locally=False, download=download)


def _task_refusal(description: ModelDescription, capability: Capability, name: str) -> str | None:
    """Whether a GGUF model does what was asked: an embedding model (its file names a
    pooling type, as llama.cpp reads it) embeds and generates nothing, any other
    generates and gives no embeddings."""
    if capability is Capability.EMBED and not description.pooling:
        return (
            f"{name} generates text; it gives no embeddings (its file names no pooling "
            "type): call Generate, or name an embedding model"
        )
    if capability is Capability.TEXT and description.pooling:
        return f"{name} is an embedding model ({description.pooling} pooling); call Embed"
    return None


def _verdict(backend: str, description: ModelDescription, refusal: str | None) -> Decision:
    if refusal is not None:
        return Decision(False, refusal, backend, description, available_locally=True)
    reason = f"{backend} serves {description.architecture} ({description.quantization.method})"
    return Decision(True, reason, backend, description, available_locally=True)


def _not_cached(source: ModelSource, offline: bool) -> Decision:
    return Decision(False, not_downloaded(source, offline=offline))


def not_downloaded(source: ModelSource, *, offline: bool = False) -> str:
    """Why a hub model that is not in the cache cannot be loaded, and what to do."""
    where = f"the Hugging Face cache has no copy of {source.hub}"
    hint = download_hint(source.hub) if source.hub else ""
    if offline:
        return f"{where}, and offline mode is on: download it first ({hint})"
    return f"{where}: download it first ({hint})"


def download_hint(hub: HubReference) -> str:
    """The commands that fetch exactly what the reference names, and no other file."""
    command = f"hf download {hub.repo_id}"
    if hub.file is not None:
        split = SPLIT_GGUF.match(posixpath.basename(hub.file))
        if split is not None:
            command += f' --include "{split["prefix"]}-*-of-{split["count"]}.gguf"'
        elif hub.file.endswith(".gguf"):
            command += f" {hub.file}"
        else:  # a quantization tag: the files whose names carry it
            command += f' --include "*{hub.file}*.gguf"'
    if hub.revision:
        command += f" --revision {hub.revision}"
    return f"`inference-client pull {hub}`, or `{command}`"
