"""An embedding model (BERT and its kin) loaded with llama.cpp in its embedding mode.

llama.cpp pools each sequence's token vectors the way the model's file says
(`{arch}.pooling_type`: mean for all-MiniLM-L6-v2, the [CLS] token for BGE, the
last token for decoder-based embedders) and `llama_get_embeddings_seq` gives one
vector per sequence. Several inputs go into one evaluation as sequences of their
own; a model without a causal mask must see each sequence whole in one step,
so the step is at least the model's window.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import llama_cpp
import numpy as np
from llama_cpp._internals import LlamaContext

from service.backends.failure import load_refused
from service.backends.llama_cpp import log as llama_log
from service.backends.llama_cpp.backend import LlamaCppOptions, _load_model
from service.backends.names import LLAMA_CPP_EMBEDDINGS
from service.embeddings.requests import Vector
from service.errors import BackendFailure

_POOLING = {
    llama_cpp.LLAMA_POOLING_TYPE_MEAN: "mean",
    llama_cpp.LLAMA_POOLING_TYPE_CLS: "cls",
    llama_cpp.LLAMA_POOLING_TYPE_LAST: "last",
}
# Tokens one evaluation reads at most (never fewer than the model's window), and the
# sequences it holds: llama.cpp keeps at most 256 apart.
STEP_TOKENS = 4096
MAX_SEQUENCES = 64


@dataclass(frozen=True)
class EmbedderOptions:
    threads: int
    gpu_layers: int = -1
    main_gpu: int = 0


class LlamaCppEmbedder:
    """One embedding GGUF; not thread-safe: the model's worker owns it."""

    def __init__(self, path: Path, options: EmbedderOptions) -> None:
        model_options = LlamaCppOptions(
            context_size=0,
            threads=options.threads,
            gpu_layers=options.gpu_layers,
            main_gpu=options.main_gpu,
        )
        self._model = _load_model(path, model_options)
        self._window = max(self._model.n_ctx_train(), 1)
        self._step = max(STEP_TOKENS, self._window)
        params = llama_cpp.llama_context_default_params()
        params.embeddings = True
        params.n_ctx = self._step
        params.n_batch = params.n_ubatch = self._step
        params.n_seq_max = MAX_SEQUENCES
        params.kv_unified = True  # one pool for a decoder-based embedder, not a slice each
        params.n_threads = params.n_threads_batch = options.threads
        try:
            # The step is wider than the trained window (it holds many inputs, each
            # within it), which llama.cpp warns about.
            with llama_log.expected_native_warnings("possible training context overflow"):
                self._context = LlamaContext(model=self._model, params=params, verbose=False)
        except ValueError as exc:
            self._model.close()
            raise BackendFailure(f"llama.cpp could not create a context: {exc}") from exc
        pooling = llama_cpp.llama_pooling_type(self._context.ctx)
        if pooling not in _POOLING:
            self.close()
            raise load_refused(
                "llama.cpp",
                path,
                "the model gives a vector per token, not one per input "
                "(no pooling type in its file)",
            )
        self._pooling = _POOLING[pooling]
        self._memory = llama_cpp.llama_get_memory(self._context.ctx)
        self._dimensions = int(llama_cpp.llama_model_n_embd(self._model.model))
        self._vocab_size = self._model.n_vocab()
        self._batch: llama_cpp.llama_batch | None = llama_cpp.llama_batch_init(self._step, 0, 1)

    @property
    def name(self) -> str:
        return LLAMA_CPP_EMBEDDINGS

    @property
    def context_length(self) -> int:
        return self._window

    @property
    def dimensions(self) -> int:
        return self._dimensions

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def pooling(self) -> str:
        return self._pooling

    @property
    def max_sequences(self) -> int:
        return MAX_SEQUENCES

    def tokenize(self, text: str) -> list[int]:
        ids = self._model.tokenize(text.encode("utf-8"), add_bos=True, special=False)
        return [int(token) for token in ids]

    def embed(self, inputs: Sequence[Sequence[int]]) -> list[Vector]:
        vectors: list[Vector] = []
        for group in self._groups(inputs):
            vectors.extend(self._evaluate(group))
        return vectors

    def _groups(self, inputs: Sequence[Sequence[int]]) -> list[list[Sequence[int]]]:
        """The inputs in order, cut into evaluations of at most a step's tokens and
        MAX_SEQUENCES inputs."""
        groups: list[list[Sequence[int]]] = [[]]
        tokens = 0
        for ids in inputs:
            full = len(groups[-1]) == MAX_SEQUENCES or tokens + len(ids) > self._step
            if groups[-1] and full:
                groups.append([])
                tokens = 0
            groups[-1].append(ids)
            tokens += len(ids)
        return groups

    def _evaluate(self, group: list[Sequence[int]]) -> list[Vector]:
        batch = self._batch
        if batch is None:
            raise RuntimeError("this embedding model was closed")
        index = 0
        for seq_id, ids in enumerate(group):
            for position, token in enumerate(ids):
                batch.token[index] = token
                batch.pos[index] = position  # type: ignore[call-overload]
                batch.n_seq_id[index] = 1
                batch.seq_id[index][0] = seq_id
                batch.logits[index] = True
                index += 1
        batch.n_tokens = index
        if self._memory:  # a decoder-based embedder keeps a cache: empty it first
            llama_cpp.llama_memory_clear(self._memory, True)
        status = llama_cpp.llama_decode(self._context.ctx, batch)
        if status != 0:
            raise RuntimeError(f"llama_decode failed with status {status}")
        return [self._pooled(seq_id) for seq_id in range(len(group))]

    def _pooled(self, seq_id: int) -> Vector:
        pointer = llama_cpp.llama_get_embeddings_seq(self._context.ctx, seq_id)
        if not pointer:
            raise RuntimeError(f"llama.cpp gave no pooled vector for sequence {seq_id}")
        vector: Vector = np.ctypeslib.as_array(pointer, shape=(self._dimensions,)).copy()
        if not np.all(np.isfinite(vector)):
            raise RuntimeError("llama.cpp gave a vector that is not finite")
        return vector

    def close(self) -> None:
        if getattr(self, "_batch", None) is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        if getattr(self, "_context", None) is not None:
            self._context.close()
        self._model.close()
