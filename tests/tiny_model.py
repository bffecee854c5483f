"""A tiny llama-shaped GGUF for plumbing tests, where the model's words do not matter.

bench/gpu_model.py writes it: two layers of width 128 with random weights, and
SmolLM2's real vocabulary and tokenizer, so prompts, chat templates and token ids
work as with SmolLM2 while a decode step costs about a third of SmolLM2's (the rest
is the service's own work per token). Its text is noise, and like any model it may
end a generation early (its end-of-turn token is SmolLM2's): the tests' greedy
"Count: 1, 2, 3," runs to 400 tokens, and a test that needs that says so.

Reading SmolLM2's vocabulary takes seconds, so the file is kept in pytest's cache
(.pytest_cache), under a name that changes with the writer and the vocabulary file.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from bench import gpu_model
from service.models.embedded import EMBEDDED_MODELS

SMOLLM = "smollm2-135m-instruct"
SHAPE, FILE_TYPE = "tiny", "Q8_0"


def tiny_gguf(directory: Path) -> Path:
    """The tiny model in `directory`, written there unless an identical one is."""
    vocab = EMBEDDED_MODELS[SMOLLM].locate()
    key = hashlib.sha256()
    key.update(Path(gpu_model.__file__).read_bytes())
    key.update(f"{vocab.resolve()}:{vocab.stat().st_size}:{SHAPE}:{FILE_TYPE}".encode())
    path = directory / f"tiny-{key.hexdigest()[:16]}.gguf"
    if not path.is_file():
        directory.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.partial")
        gpu_model.build(partial, vocab, SHAPE, FILE_TYPE, threads=1)
        os.replace(partial, path)  # whole or absent, for a run beside this one
    return path
