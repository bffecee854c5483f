"""One model's load and serving options: the server's, less what the model overrides.

The one copy of them: the catalog's ModelSpec holds it, the engine gets it in
its EngineOptions, and each backend takes what it needs from it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING

from service.backends.names import FlashAttention, KvLayout, SampleInGraph

if TYPE_CHECKING:
    from service.config import ModelConfig, ModelOptionSettings


@dataclass(frozen=True)
class ModelOptions:
    """Each field is the server setting of the same name (see ModelOptionSettings)."""

    context_size: int
    threads: int
    gpu_layers: int = -1
    main_gpu: int = 0
    flash_attention: FlashAttention = "auto"
    # Generations of this model decoded together, and finished ones kept cached.
    parallel_sequences: int = 8
    cached_sequences: int = 4
    kv_layout: KvLayout = "auto"
    # llama.cpp's step size; None: by where the model computes.
    batch_size: int | None = None
    # Tokens per streamed message after the first.
    stream_interval: int = 1
    sample_in_graph: SampleInGraph = "auto"
    # Prompt-lookup guesses per step for greedy llama.cpp sequences; 0: no speculation.
    draft_tokens: int = 0

    @classmethod
    def from_settings(cls, settings: ModelOptionSettings) -> ModelOptions:
        """What the server's settings give every model."""
        return cls(**{field.name: getattr(settings, field.name) for field in fields(cls)})

    def with_overrides(self, config: ModelConfig) -> ModelOptions:
        """These options, less what a configured model sets itself."""
        return replace(
            self,
            context_size=config.context_size or self.context_size,
            threads=config.threads or self.threads,
            gpu_layers=self.gpu_layers if config.gpu_layers is None else config.gpu_layers,
        )
