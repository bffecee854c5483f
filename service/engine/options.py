"""What an engine needs to load and serve one model, and its form on the wire."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, get_args

from inference.engine.v1 import engine_pb2 as epb
from service.backends.names import LLAMA_CPP_EMBEDDINGS, FlashAttention, KvLayout, SampleInGraph
from service.engine.model_options import ModelOptions

# Load carries each ModelOptions field under the same name.
_MODEL_FIELDS = tuple(field.name for field in fields(ModelOptions))
# OpenAI's bound on the tokens of one embeddings request, and the tokens of one
# embedding batch (the embedder's own step): the settings' defaults.
REQUEST_TOKEN_BUDGET = 300_000
EMBED_BATCH_TOKENS = 4096


@dataclass(frozen=True)
class EngineOptions:
    """One model's load options, resolved by the front (path confined, backend admitted)."""

    name: str
    backend: str  # "llama.cpp", "mlx-lm", "diffusers"
    path: Path
    model: ModelOptions
    max_waiting_sequences: int = 64
    chat_template: str | None = None
    default_max_tokens: int = 512
    max_decode_seconds: float | None = None
    log_level: str = "info"
    request_token_budget: int = REQUEST_TOKEN_BUDGET
    embed_batch_tokens: int = EMBED_BATCH_TOKENS

    @property
    def embeddings(self) -> bool:
        """Loaded to embed (llama.cpp's embedding mode), not to generate."""
        return self.backend == LLAMA_CPP_EMBEDDINGS

    def to_pb(self) -> epb.Load:
        load = epb.Load(
            name=self.name,
            backend=self.backend,
            path=str(self.path),
            max_waiting_sequences=self.max_waiting_sequences,
            default_max_tokens=self.default_max_tokens,
            log_level=self.log_level,
            request_token_budget=self.request_token_budget,
            embed_batch_tokens=self.embed_batch_tokens,
            **asdict(self.model),
        )
        if self.chat_template is not None:
            load.chat_template = self.chat_template
        if self.max_decode_seconds is not None:
            load.max_decode_seconds = self.max_decode_seconds
        return load

    @classmethod
    def from_pb(cls, load: epb.Load) -> EngineOptions:
        model: dict[str, Any] = {name: getattr(load, name) for name in _MODEL_FIELDS}
        model["flash_attention"] = _choice(load.flash_attention, FlashAttention)
        model["kv_layout"] = _choice(load.kv_layout, KvLayout)
        model["sample_in_graph"] = _choice(load.sample_in_graph or "auto", SampleInGraph)
        model["batch_size"] = load.batch_size if load.HasField("batch_size") else None
        return cls(
            name=load.name,
            backend=load.backend,
            path=Path(load.path),
            model=ModelOptions(**model),
            max_waiting_sequences=load.max_waiting_sequences,
            chat_template=load.chat_template if load.HasField("chat_template") else None,
            default_max_tokens=load.default_max_tokens,
            max_decode_seconds=(
                load.max_decode_seconds if load.HasField("max_decode_seconds") else None
            ),
            log_level=load.log_level or "info",
            request_token_budget=load.request_token_budget or REQUEST_TOKEN_BUDGET,
            embed_batch_tokens=load.embed_batch_tokens or EMBED_BATCH_TOKENS,
        )


def _choice(value: str, allowed: object) -> Any:
    """`value` if it is one of the Literal's values; the front only sends those."""
    if value not in get_args(allowed):
        raise ValueError(f"unexpected option value {value!r}")
    return value
