"""What an embedding backend offers the engine; llama.cpp's is the one there is."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from service.embeddings.requests import Vector


@runtime_checkable
class EmbeddingBackend(Protocol):
    """A loaded embedding model; its methods run on the model's worker thread."""

    @property
    def name(self) -> str: ...

    @property
    def context_length(self) -> int:
        """The most tokens one input may hold (the model's window)."""
        ...

    @property
    def dimensions(self) -> int: ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def pooling(self) -> str:
        """How token vectors become one: "mean", "cls", "last"."""
        ...

    @property
    def max_sequences(self) -> int:
        """Inputs one evaluation takes together."""
        ...

    def tokenize(self, text: str) -> list[int]:
        """The text's ids, with the model's own special tokens."""
        ...

    def embed(self, inputs: Sequence[Sequence[int]]) -> list[Vector]:
        """One pooled vector per input (not normalized), in as few evaluations as the
        model's step allows."""
        ...

    def close(self) -> None: ...
