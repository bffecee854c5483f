"""What an engine needs to load and serve one model, and its form on the wire."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

from inference.engine.v1 import engine_pb2 as epb
from service.backends.names import FlashAttention, KvLayout


@dataclass(frozen=True)
class EngineOptions:
    """One model's load options, resolved by the front (path confined, backend admitted)."""

    name: str
    backend: str  # "llama.cpp", "mlx-lm", "diffusers"
    path: Path
    context_size: int
    threads: int
    gpu_layers: int = -1
    main_gpu: int = 0
    flash_attention: FlashAttention = "auto"
    parallel_sequences: int = 8
    cached_sequences: int = 4
    kv_layout: KvLayout = "unified"
    stream_interval: int = 1
    max_waiting_sequences: int = 64
    chat_template: str | None = None
    default_max_tokens: int = 512
    max_decode_seconds: float | None = None
    log_level: str = "info"

    def to_pb(self) -> epb.Load:
        load = epb.Load(
            name=self.name,
            backend=self.backend,
            path=str(self.path),
            context_size=self.context_size,
            threads=self.threads,
            gpu_layers=self.gpu_layers,
            main_gpu=self.main_gpu,
            flash_attention=self.flash_attention,
            parallel_sequences=self.parallel_sequences,
            cached_sequences=self.cached_sequences,
            kv_layout=self.kv_layout,
            stream_interval=self.stream_interval,
            max_waiting_sequences=self.max_waiting_sequences,
            default_max_tokens=self.default_max_tokens,
            log_level=self.log_level,
        )
        if self.chat_template is not None:
            load.chat_template = self.chat_template
        if self.max_decode_seconds is not None:
            load.max_decode_seconds = self.max_decode_seconds
        return load

    @classmethod
    def from_pb(cls, load: epb.Load) -> EngineOptions:
        return cls(
            name=load.name,
            backend=load.backend,
            path=Path(load.path),
            context_size=load.context_size,
            threads=load.threads,
            gpu_layers=load.gpu_layers,
            main_gpu=load.main_gpu,
            flash_attention=_choice(load.flash_attention, FlashAttention),
            parallel_sequences=load.parallel_sequences,
            cached_sequences=load.cached_sequences,
            kv_layout=_choice(load.kv_layout, KvLayout),
            stream_interval=load.stream_interval,
            max_waiting_sequences=load.max_waiting_sequences,
            chat_template=load.chat_template if load.HasField("chat_template") else None,
            default_max_tokens=load.default_max_tokens,
            max_decode_seconds=(
                load.max_decode_seconds if load.HasField("max_decode_seconds") else None
            ),
            log_level=load.log_level or "info",
        )


def _choice(value: str, allowed: object) -> Any:
    """`value` if it is one of the Literal's values; the front only sends those."""
    if value not in get_args(allowed):
        raise ValueError(f"unexpected option value {value!r}")
    return value
