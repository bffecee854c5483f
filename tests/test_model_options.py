"""A model's options: the server's settings, overridden by what a configured model sets."""

from __future__ import annotations

from dataclasses import fields

from service.backends.llama_cpp import LlamaCppOptions
from service.config import ModelConfig, ModelOptionSettings, Settings
from service.engine.loading import llama_cpp_options
from service.engine.model_options import ModelOptions


def test_each_option_is_the_setting_of_its_name() -> None:
    assert {field.name for field in fields(ModelOptions)} == set(ModelOptionSettings.model_fields)
    settings = Settings(
        threads=3, gpu_layers=0, main_gpu=1, flash_attention="off", context_size=2048,
        parallel_sequences=5, cached_sequences=2, kv_layout="per-sequence", stream_interval=4,
        batch_size=256,
    )  # fmt: skip
    options = ModelOptions.from_settings(settings)
    assert options == ModelOptions(
        context_size=2048, threads=3, gpu_layers=0, main_gpu=1, flash_attention="off",
        parallel_sequences=5, cached_sequences=2, kv_layout="per-sequence", stream_interval=4,
        batch_size=256,
    )  # fmt: skip


def test_a_model_overrides_only_what_it_sets() -> None:
    server = ModelOptions(context_size=4096, threads=8, gpu_layers=-1, cached_sequences=2)
    assert server.with_overrides(ModelConfig(source="m.gguf")) == server
    own = server.with_overrides(
        ModelConfig(source="m.gguf", context_size=512, threads=2, gpu_layers=0)
    )
    assert own == ModelOptions(context_size=512, threads=2, gpu_layers=0, cached_sequences=2)


def test_llama_cpp_takes_its_options_from_the_model_and_keeps_its_own_knobs() -> None:
    model = ModelOptions(
        context_size=512, threads=2, gpu_layers=3, main_gpu=1, flash_attention="on",
        parallel_sequences=6, cached_sequences=1, kv_layout="per-sequence", stream_interval=9,
        batch_size=2048,
    )  # fmt: skip
    assert llama_cpp_options(model) == LlamaCppOptions(
        context_size=512, threads=2, gpu_layers=3, main_gpu=1, flash_attention="on",
        kv_layout="per-sequence", max_sequences=6, cached_sequences=1, batch_size=2048,
    )  # fmt: skip
    # Unset, the backend chooses by where the model computes.
    assert llama_cpp_options(ModelOptions(context_size=512, threads=2)).batch_size is None
