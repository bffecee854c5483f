"""Filling one llama_batch with tokens of several sequences and decoding it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import llama_cpp

from service.backends.llama_cpp.log import expected_native_warnings


@dataclass(frozen=True)
class Chunk:
    """Consecutive tokens of one sequence, evaluated in one decode call."""

    seq_id: int
    start: int  # the position of the first token in its sequence
    tokens: Sequence[int]
    wants_logits: bool  # whether the last token's output is sampled
    # Every token's output, not the last one's only (drafted tokens being verified).
    every_output: bool = False


class StepInterrupted(Exception):
    """llama_decode stopped at the interrupt flag (service.backends.native.interrupt):
    the micro-batch it was in left nothing in the cache, those before it did."""


# llama_decode's status when the abort callback stopped it.
ABORTED = 2
# What llama.cpp logs, as errors, of an interrupted step (ggml's status 1 is
# GGML_STATUS_ABORTED): the scheduler asked for it, and the operator need not hear.
INTERRUPTED_LINES = (
    "failed with error 1",
    "compute status: 1",
    "failed to decode, ret = 2",
    "removing memory module entries",
)


class Batch:
    """A reusable llama_batch holding up to `capacity` tokens, one sequence id each."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._batch: llama_cpp.llama_batch | None = llama_cpp.llama_batch_init(capacity, 0, 1)
        self._outputs: list[int] = []

    def fill(self, chunks: Sequence[Chunk]) -> None:
        """Put the chunks in the batch; per chunk, `decode` returns its output index."""
        batch = self._live()
        outputs: list[int] = []
        index = 0
        for chunk in chunks:
            for offset, token in enumerate(chunk.tokens):
                batch.token[index] = token
                batch.pos[index] = chunk.start + offset  # type: ignore[call-overload]
                batch.n_seq_id[index] = 1
                batch.seq_id[index][0] = chunk.seq_id
                batch.logits[index] = chunk.every_output
                index += 1
            if chunk.wants_logits:
                batch.logits[index - 1] = True
            outputs.append(index - 1 if chunk.wants_logits else -1)
        batch.n_tokens = index
        self._outputs = outputs

    def decode(self, context: llama_cpp.llama_context_p) -> list[int]:
        """Evaluate what `fill` put in; per chunk, its output index (or -1)."""
        with expected_native_warnings(*INTERRUPTED_LINES):
            status = llama_cpp.llama_decode(context, self._live())
        if status == ABORTED:
            raise StepInterrupted
        if status != 0:
            # 1: no room in the KV cache; <0: an error inside llama.cpp. Either way the
            # cache state of this batch is unknown.
            raise RuntimeError(f"llama_decode failed with status {status}")
        return self._outputs

    def close(self) -> None:
        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None

    def _live(self) -> llama_cpp.llama_batch:
        if self._batch is None:
            raise RuntimeError("this batch was freed")
        return self._batch
