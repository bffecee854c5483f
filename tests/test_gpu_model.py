"""The GPU benchmark model's writer: a tiny variant loads and decodes with llama.cpp on the CPU."""

from __future__ import annotations

from pathlib import Path

import pytest
from llama_cpp import Llama

from bench.gpu_model import SHAPES, build
from service.models.embedded import EMBEDDED_MODELS
from tests.conftest import SMOLLM


@pytest.mark.parametrize(("file_type", "ftype_id"), [("F16", 1), ("Q8_0", 7)])
def test_the_writer_makes_a_file_llama_cpp_loads_with_the_copied_vocabulary(
    tmp_path: Path, file_type: str, ftype_id: int
) -> None:
    vocab = EMBEDDED_MODELS[SMOLLM].locate()  # any GGUF with a tokenizer will do
    out = tmp_path / "tiny.gguf"
    build(out, vocab, "tiny", file_type, threads=1)
    source = Llama(str(vocab), vocab_only=True, verbose=False)
    llama = Llama(str(out), n_ctx=64, n_threads=1, verbose=False)
    try:
        assert llama.n_vocab() == source.n_vocab()
        assert llama.tokenize(b"Hello world") == source.tokenize(b"Hello world")
        assert llama.metadata["llama.block_count"] == str(SHAPES["tiny"].layers)
        assert llama.metadata["general.file_type"] == str(ftype_id)
        prompt = llama.tokenize(b"Hello world", add_bos=True)
        assert llama.detokenize(prompt) == b"Hello world"  # the real tokenizer, not a stub
        llama.eval(prompt)
        assert 0 <= llama.sample(top_k=1) < llama.n_vocab()
    finally:
        llama.close()
        source.close()
