"""What an Embed request asks for, as the front validates it, and what it gets back."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from inference.v1 import inference_pb2 as pb
from service.errors import InvalidRequest

# Inputs one request may carry (OpenAI's bound), and token ids one input may give.
MAX_INPUTS = 2048
MAX_INPUT_TOKENS = 1 << 16

Vector = npt.NDArray[np.float32]


@dataclass(frozen=True)
class EmbedInput:
    """A text, tokenized by the model with its special tokens, or token ids as given."""

    text: str | None = None
    tokens: tuple[int, ...] | None = None


@dataclass(frozen=True)
class EmbedRequest:
    model: str
    inputs: tuple[EmbedInput, ...]
    normalize: bool = True
    truncate: bool = False

    @classmethod
    def from_pb(cls, msg: pb.EmbedRequest, default_model: str = "") -> EmbedRequest:
        request = cls(
            model=msg.model or default_model,
            inputs=tuple(_input(item, index) for index, item in enumerate(msg.inputs)),
            normalize=msg.normalize if msg.HasField("normalize") else True,
            truncate=msg.truncate,
        )
        request.validate()
        return request

    def validate(self) -> None:
        if not self.model:
            raise InvalidRequest(
                "name an embedding model in `model`: this server has no default embedding "
                "model (--default-embedding-model)"
            )
        if not self.inputs:
            raise InvalidRequest("give at least one input to embed")
        if len(self.inputs) > MAX_INPUTS:
            raise InvalidRequest(
                f"{len(self.inputs)} inputs in one request; at most {MAX_INPUTS}: split them"
            )

    def to_pb(self) -> list[pb.EmbedInput]:
        return [_input_pb(item) for item in self.inputs]


def _input(item: pb.EmbedInput, index: int) -> EmbedInput:
    kind = item.WhichOneof("input")
    if kind == "text":
        if not item.text:
            raise InvalidRequest(f"input {index} is an empty text; nothing to embed")
        return EmbedInput(text=item.text)
    if kind == "tokens":
        ids = tuple(item.tokens.ids)
        if not ids:
            raise InvalidRequest(f"input {index} has no token ids; nothing to embed")
        if len(ids) > MAX_INPUT_TOKENS:
            raise InvalidRequest(
                f"input {index} has {len(ids)} token ids; at most {MAX_INPUT_TOKENS}"
            )
        return EmbedInput(tokens=ids)
    raise InvalidRequest(f"input {index} is empty: give a text or token ids")


def _input_pb(item: EmbedInput) -> pb.EmbedInput:
    if item.text is not None:
        return pb.EmbedInput(text=item.text)
    return pb.EmbedInput(tokens=pb.EmbedTokens(ids=item.tokens or ()))


def inputs_from_pb(items: Sequence[pb.EmbedInput]) -> tuple[EmbedInput, ...]:
    """The inputs as the engine receives them (the front validated them)."""
    return tuple(_input(item, index) for index, item in enumerate(items))


@dataclass(frozen=True)
class Embedded:
    """The vectors of one request, in its inputs' order."""

    vectors: list[Vector]
    tokens: list[int]  # read per input, after truncation
    truncated: list[bool]
    pooling: str
    normalized: bool

    @property
    def dimensions(self) -> int:
        return int(self.vectors[0].shape[0]) if self.vectors else 0

    def to_pb(self, model: str, total_ms: float = 0.0) -> pb.EmbedResponse:
        rows = zip(self.vectors, self.tokens, self.truncated, strict=True)
        return pb.EmbedResponse(
            embeddings=[
                pb.Embedding(values=vector.tolist(), tokens=count, truncated=cut)
                for vector, count, cut in rows
            ],
            model=model,
            dimensions=self.dimensions,
            pooling=self.pooling,
            normalized=self.normalized,
            prompt_tokens=sum(self.tokens),
            total_ms=total_ms,
        )

    @classmethod
    def from_pb(cls, msg: pb.EmbedResponse) -> Embedded:
        return cls(
            vectors=[np.asarray(item.values, dtype=np.float32) for item in msg.embeddings],
            tokens=[item.tokens for item in msg.embeddings],
            truncated=[item.truncated for item in msg.embeddings],
            pooling=msg.pooling,
            normalized=msg.normalized,
        )
