"""Settings: one object built at start-up and passed explicitly.

Precedence, highest first: command-line flags, environment variables
(`INFERENCE_` prefix), the TOML file named by `--config` (or
`INFERENCE_CONFIG`), then the defaults below. Every field's description is
its `--help` text.

The fields are grouped by section (ServerSettings, PoolSettings,
ModelOptionSettings, LimitSettings, ImageSettings); Settings joins them into
one flat object, so a flag, variable or TOML key is a field's name whichever
section holds it.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import yaml
from huggingface_hub import constants as hf_constants
from huggingface_hub import get_token
from pydantic import (
    AliasChoices,
    BaseModel,
    ByteSize,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, EnvSettingsSource, NoDecode, SettingsConfigDict

from service.backends.names import FlashAttention, KvLayout, SampleInGraph

ENV_PREFIX = "INFERENCE_"


def _hub_token() -> SecretStr | None:
    token = get_token()
    return SecretStr(token) if token else None


__all__ = [
    "FlashAttention",
    "ImageSettings",
    "KvLayout",
    "LimitSettings",
    "ModelConfig",
    "ModelOptionSettings",
    "PoolSettings",
    "ServerSettings",
    "Settings",
    "load_settings",
]


def available_cores() -> int:
    """Cores this process may run on (the affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class ModelConfig(BaseModel):
    """One operator-configured model."""

    source: str = Field(
        validation_alias=AliasChoices("source", "path"),
        description="A .gguf file, a checkpoint directory, or a Hugging Face repo "
        "(owner/name[@revision][:file.gguf]); relative paths are looked up in the models dirs.",
    )
    context_size: int | None = Field(
        default=None, gt=0, description="Context window in tokens; default: the server's."
    )
    threads: int | None = Field(
        default=None, gt=0, description="Threads for this model; default: the server's."
    )
    gpu_layers: int | None = Field(
        default=None, description="Layers to offload to the GPU; default: the server's."
    )
    chat_template: str | None = Field(
        default=None,
        description="A Jinja chat template that replaces (or supplies) the model's own.",
    )
    backend: Literal["auto", "external"] = Field(
        default="auto",
        description="auto: the backend the model's files call for; external: generate images "
        "with the external image command (source is then its model name or a hub repo).",
    )
    base_model: str = Field(
        default="dev",
        description="For the external image command: the architecture family of a hub repo "
        "source (its --base-model).",
    )


class ServerSettings(BaseModel):
    """The gRPC server: where it listens, TLS and auth, transport limits, probes, logs."""

    listen: str = Field(
        default="127.0.0.1:50051",
        description="Address to serve gRPC on, HOST:PORT (port 0 picks a free port).",
    )
    max_receive_message_bytes: ByteSize = Field(
        default=ByteSize(16 << 20),
        gt=0,
        description="Largest gRPC message the server accepts.",
    )
    max_send_message_bytes: ByteSize = Field(
        default=ByteSize(64 << 20),
        gt=0,
        description="Largest gRPC message the server sends (a generated PNG is one message).",
    )
    keepalive_time: float = Field(
        default=30.0,
        gt=0,
        description="Seconds between HTTP/2 pings on an idle connection, so proxies keep "
        "long streams open.",
    )
    keepalive_timeout: float = Field(
        default=20.0, gt=0, description="Seconds to wait for a ping's answer before closing."
    )
    max_health_watches: int = Field(
        default=1024,
        gt=0,
        description="grpc.health.v1 Watch streams open at once, server-wide (Watch needs no "
        "token); past it RESOURCE_EXHAUSTED.",
    )
    max_health_watches_per_connection: int = Field(
        default=16, gt=0, description="Health Watch streams one connection may hold open."
    )
    max_streams_per_connection: int = Field(
        default=256,
        gt=0,
        description="Streams one HTTP/2 connection may have open at once (its "
        "SETTINGS_MAX_CONCURRENT_STREAMS); a proxy opens more connections past it.",
    )
    health_listen: str | None = Field(
        default=None,
        description="Also serve only grpc.health.v1 on HOST:PORT, plaintext and without auth, "
        "for probes that cannot speak TLS (off when unset).",
    )
    tls_cert: Path | None = Field(
        default=None, description="PEM server certificate (chain); with tls_key, serve TLS."
    )
    tls_key: Path | None = Field(default=None, description="PEM private key of tls_cert.")
    tls_client_ca: Path | None = Field(
        default=None,
        description="PEM CA bundle; when set, clients must present a certificate it signed (mTLS).",
    )
    auth_token: SecretStr | None = Field(
        default=None,
        description="Require `authorization: Bearer TOKEN` metadata on Inference RPCs "
        "(health and reflection stay open).",
    )
    metrics_listen: str | None = Field(
        default=None,
        description="Serve Prometheus metrics over HTTP on HOST:PORT at /metrics (off when unset).",
    )
    http_listen: str | None = Field(
        default=None,
        description="Serve the OpenAI-compatible HTTP API (/v1/chat/completions, "
        "/v1/completions, /v1/models) on HOST:PORT, with the gRPC port's token and TLS "
        "(off when unset).",
    )
    address_file: Path | None = Field(
        default=None,
        description="Once listening, write the bound addresses to this file as JSON "
        "(`grpc`, and `http`, `health`, `metrics` where served), so that a supervisor "
        "that asked for port 0 learns the ports without a race (the cluster launcher "
        "does).",
    )
    http_body_seconds: float = Field(
        default=30.0,
        gt=0,
        description="Seconds an HTTP request's body may take to arrive once its headers have "
        "(it holds no slot meanwhile); past it the request is answered 408 and its "
        "connection closed.",
    )
    http_max_body_bytes: ByteSize = Field(
        default=ByteSize(16 << 20),
        gt=0,
        description="Largest HTTP request body, by its Content-Length or as it arrives "
        "(chunked too); past it 413 and the connection closed. The gRPC port's bound is "
        "--max-receive-message-bytes.",
    )
    http_body_memory_bytes: ByteSize = Field(
        default=ByteSize(256 << 20),
        gt=0,
        description="Bytes of HTTP request bodies the server holds while they arrive, all "
        "requests together; a body that would pass it is answered 503 (retry).",
    )
    http_max_connections: int = Field(
        default=1024,
        gt=0,
        description="Open HTTP connections at most (fewer if the file-descriptor limit "
        "less --fd-reserve is lower); at the cap the longest-idle one is closed, or, all "
        "busy, the new one is answered 503.",
    )
    http_max_connections_per_peer: int = Field(
        default=256,
        gt=0,
        description="Open HTTP connections from one address at most (a proxy in front "
        "counts as one address), at the cap treated as --http-max-connections.",
    )
    http_max_head_bytes: ByteSize = Field(
        default=ByteSize(64 << 10),
        ge=1024,
        description="Bytes of one HTTP request's line and headers; past it 431 and the "
        "connection closed.",
    )
    http_idle_seconds: float = Field(
        default=10.0,
        gt=0,
        description="Seconds an HTTP connection may stay idle (before its first request, "
        "while its headers arrive, between requests) before it is closed.",
    )
    fd_reserve: int = Field(
        default=256,
        ge=0,
        description="File descriptors kept free of HTTP connections for the gRPC port, "
        "engines and model files (the soft limit is first raised to the hard one).",
    )
    http_cors_origins: str | None = Field(
        default=None,
        description="Origins whose browser pages may call the HTTP API, comma-separated "
        "(https://app.example.com, exact), or * for any; preflights answered, CORS headers "
        "on every answer (off when unset).",
    )
    grace_period: float = Field(
        default=10.0,
        ge=0,
        description="Seconds in-flight requests may take to finish on SIGTERM/SIGINT.",
    )
    log_format: Literal["auto", "json", "console"] = Field(
        default="auto",
        description="Log lines as JSON or for a console; auto picks JSON unless on a terminal.",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default="info", description="The least severe log level written."
    )


class PoolSettings(BaseModel):
    """The models: which there are, where their files are, and how many stay loaded in what
    memory, each in its engine."""

    default_model: str = Field(
        default="smollm2-135m-instruct",
        description="Model that serves requests which leave `model` empty.",
    )
    default_embedding_model: str = Field(
        default="all-minilm-l6-v2",
        description="Model that serves Embed (and /v1/embeddings) requests which leave "
        "`model` empty.",
    )
    models: dict[str, ModelConfig] = Field(
        default_factory=dict,
        description="Extra models by name, besides the embedded ones (NAME=SOURCE).",
    )
    models_file: Path | None = Field(
        default=None,
        description="A TOML or YAML file mapping model names to a source and options.",
    )
    models_dir: Annotated[list[Path], NoDecode] = Field(
        default_factory=list,
        description="Directories requests may name models in (relative paths resolve "
        f"there; nothing outside them is opened). Env: {os.pathsep!r}-separated.",
    )
    hf_cache_dir: Path = Field(
        default_factory=lambda: Path(hf_constants.HF_HUB_CACHE),
        description="The Hugging Face hub cache (the one transformers uses).",
    )
    hf_offline: bool = Field(
        default_factory=lambda: bool(hf_constants.HF_HUB_OFFLINE),
        description="Never contact the Hugging Face hub; use only what is in its cache "
        "(wins over everything else about the hub).",
    )
    allow_pull: bool = Field(
        default=False,
        description="Let clients download hub models into the hub cache with the Pull RPC "
        "(off: Pull is FAILED_PRECONDITION; --hf-offline wins).",
    )
    pull_on_demand: bool = Field(
        default=False,
        description="With --allow-pull: Generate on a hub model that is not downloaded pulls "
        "it first (its time to first token then includes the download).",
    )
    hf_endpoint: str = Field(
        default_factory=lambda: hf_constants.ENDPOINT,
        description="The Hugging Face hub's address (default: HF_ENDPOINT, else "
        "https://huggingface.co).",
    )
    hf_metadata_timeout: float = Field(
        default=30.0,
        gt=0,
        description="Seconds an Admit or Pull waits for the hub's metadata before "
        "UNAVAILABLE (hub calls run on threads of their own, never the ones loads use).",
    )
    hf_redirect_networks: str = Field(
        default="",
        description="Networks (comma-separated CIDRs, e.g. 10.0.0.0/8) the hub's redirects "
        "may lead into besides public addresses and the hub's own: for a mirror whose files "
        "are served from a private host. Loopback, link-local and private addresses are "
        "refused otherwise.",
    )
    hf_token: SecretStr | None = Field(
        default_factory=lambda: _hub_token(),
        description="A Hugging Face token, for gated and private repos (default: HF_TOKEN, "
        "or the token `hf auth login` saved).",
    )
    memory_budget: ByteSize | None = Field(
        default=None,
        description="Bytes loaded models may use in all, e.g. 8GiB; default: 80% of the "
        "memory available at start.",
    )
    gpu_memory_budget: ByteSize | None = Field(
        default=None,
        description="Bytes of GPU memory the offloaded layers of loaded models may use in "
        "all, e.g. 120GiB; default: no limit (the server cannot query the GPU).",
    )
    max_loaded_models: int | None = Field(
        default=None, gt=0, description="At most this many models loaded at once."
    )
    keep_alive: float = Field(
        default=600.0,
        ge=0,
        description="Seconds an idle model stays loaded (0: until evicted); the default "
        "model stays loaded.",
    )
    load_wait: float = Field(
        default=30.0,
        ge=0,
        description="Seconds a load may wait for busy models to free memory before "
        "RESOURCE_EXHAUSTED.",
    )
    engine_hang_seconds: float = Field(
        default=30.0,
        gt=0,
        description="An engine process that sends nothing (not even its heartbeat) for this "
        "long while it has requests is frozen: it is killed and its requests end UNAVAILABLE.",
    )
    engine_stall_seconds: float = Field(
        default=300.0,
        gt=0,
        description="An engine whose model makes no progress (no decode step, no task done) "
        "for this long while it has requests is stuck: it is killed likewise.",
    )
    engine_mode: Literal["process", "in-process"] = Field(
        default="process",
        description="process: each loaded model runs in an engine process of its own, so "
        "a native crash costs only that model's requests; in-process: in the server's own "
        "process, for debugging and profiling.",
    )
    engine_crash_limit: int = Field(
        default=3,
        ge=0,
        description="Engine crashes of one model within --engine-crash-window after which "
        "it is refused (FAILED_PRECONDITION) until the oldest leaves the window; 0: never.",
    )
    engine_crash_window: float = Field(
        default=600.0,
        gt=0,
        description="Seconds over which --engine-crash-limit counts a model's crashes.",
    )


class ModelOptionSettings(BaseModel):
    """What every model is loaded and served with (`ModelOptions.from_settings`); a
    configured model's own context_size, threads and gpu_layers override these."""

    threads: int = Field(
        default_factory=available_cores,
        gt=0,
        description="CPU threads per model for decoding and prompt evaluation.",
    )
    gpu_layers: int = Field(
        default=-1,
        description="Layers of a GGUF model to offload to the GPU when llama.cpp was built "
        "with one (-1: all, 0: none); a CPU-only build ignores it.",
    )
    main_gpu: int = Field(
        default=0,
        ge=0,
        description="The GPU that holds the whole model when llama.cpp sees several "
        "(its device index); one GPU alone is 0.",
    )
    flash_attention: FlashAttention = Field(
        default="auto",
        description="llama.cpp's flash attention on the GPU: auto lets llama.cpp decide per "
        "device, on forces it, off disables it.",
    )
    context_size: int = Field(
        default=4096,
        gt=0,
        description="KV cache cells: for llama.cpp, with --kv-layout unified the pool all of "
        "a model's sequences share, with per-sequence each one's; for mlx-lm, the window of its "
        "one sequence. No sequence holds more than its model was trained for.",
    )
    parallel_sequences: int = Field(
        default=8,
        ge=1,
        le=128,
        description="Generations of one text model decoded together in each step "
        "(llama.cpp batches them; other backends run one at a time).",
    )
    cached_sequences: int = Field(
        default=4,
        ge=0,
        le=128,
        description="Finished conversations whose KV cache a llama.cpp model keeps, so "
        "that the next turn evaluates only its new tokens (on the CPU only the most recent "
        "stays in the cache; older ones are parked in host memory).",
    )
    sample_in_graph: SampleInGraph = Field(
        default="auto",
        description="Where a llama.cpp model draws its tokens. on: inside llama.cpp's graph "
        "(greedy requests' argmax, and the best 128 candidates of sampled ones, come back "
        "instead of every row's logits); requests it cannot serve (a grammar, top logprobs, "
        "a top-k past 128) draw on the host in the same step. off: every draw on the host. "
        "auto: greedy requests' argmax in the graph for a model on a GPU (sampled ones "
        "draw on the host, measured faster there), every draw on the host on the CPU.",
    )
    draft_tokens: int = Field(
        default=0,
        ge=0,
        le=32,
        description="Speculative decoding by prompt lookup: up to this many tokens a "
        "greedy (temperature 0) llama.cpp sequence guesses from its own prompt and answer "
        "each step, verified in the same forward pass; the ones the model agrees with are "
        "kept, so an answer that repeats its input comes sooner. 0: off. Not with in-graph "
        "sampling, logprobs, a grammar or sampled requests (those decode one token a step).",
    )
    kv_layout: KvLayout = Field(
        default="auto",
        description="How a llama.cpp model's KV cache holds its sequences. unified: one "
        "pool of --context-size cells shared by all of them. per-sequence: --context-size "
        "cells for each (--parallel-sequences plus --cached-sequences times the memory), and "
        "each token attends to its own sequence's cells only. auto: per-sequence for a model "
        "on a GPU, where it keeps throughput rising with the streams, unified on the CPU, "
        "where memory is the tighter budget.",
    )
    batch_size: int | None = Field(
        default=None,
        ge=1,
        le=8192,
        description="The most tokens one llama.cpp step evaluates (its n_batch and n_ubatch): "
        "decoding streams first, then prompt chunks. Unset: 1024 when the model computes on a "
        "GPU, 512 on the CPU. On a GPU llama.cpp reserves a compute buffer in proportion "
        "(4 bytes per vocabulary entry per token), which the GPU memory budget counts.",
    )
    stream_interval: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Tokens per streamed message after the first, which goes out alone; "
        "the end of a generation flushes the rest. Above 1, many streams cost the event loop "
        "less per token, for the same text in fewer, larger deltas.",
    )


class LimitSettings(BaseModel):
    """What one request may ask for, and how many may run and wait at once."""

    default_max_tokens: int = Field(
        default=512,
        gt=0,
        description="Token budget of a request that does not set max_tokens.",
    )
    max_waiting_sequences: int = Field(
        default=64,
        ge=0,
        description="Generations that may wait for a place in a model's batch; beyond "
        "that a request gets RESOURCE_EXHAUSTED at once.",
    )
    max_top_logprobs: int = Field(
        default=20,
        ge=0,
        le=100,
        description="Most alternatives a request may ask for per token with top_logprobs.",
    )
    max_decode_seconds: float = Field(
        default=300.0,
        gt=0,
        description="Wall-clock ceiling on one generation; it then ends with finish "
        "reason TIME_LIMIT and keeps the text so far.",
    )
    request_token_budget: int = Field(
        default=300_000,
        gt=0,
        le=(1 << 31) - 1,
        description="Tokens one Embed (/v1/embeddings) request's inputs may hold together, "
        "counted with the model's tokenizer before any is evaluated, and tokens one Tokenize "
        "answer may hold; past it INVALID_ARGUMENT (HTTP 400) at once. OpenAI's own bound.",
    )
    embed_batch_tokens: int = Field(
        default=4096,
        gt=0,
        le=(1 << 31) - 1,
        description="Tokens one embedding batch reads at most (never fewer than the model's "
        "window): a request is evaluated batch by batch, each one progress for "
        "--engine-stall-seconds, and other requests take turns between them.",
    )
    max_concurrent: int = Field(
        default=32,
        gt=0,
        description="Generate and GenerateImage RPCs doing model work at once, server-wide "
        "(default: twice --parallel-sequences, at least 32, so one model can fill its batch "
        "within its per-model share).",
    )
    max_queue: int = Field(
        default=128,
        ge=0,
        description="RPCs that may wait for one of the max_concurrent slots; beyond it "
        "RESOURCE_EXHAUSTED at once.",
    )
    max_concurrent_per_model: int | None = Field(
        default=None,
        gt=0,
        description="Slots one model may hold at once (default: three quarters of "
        "max_concurrent), so one model's trouble cannot take every slot.",
    )
    max_queue_per_model: int | None = Field(
        default=None,
        ge=0,
        description="RPCs that may wait for one model's slots (default: three quarters of "
        "max_queue).",
    )
    stream_buffer_bytes: ByteSize = Field(
        default=ByteSize(1 << 20),
        gt=0,
        description="Bytes of responses a stream may hold for a client that reads slowly; "
        "the generation waits while it is full.",
    )
    send_stall_seconds: float = Field(
        default=30.0,
        gt=0,
        description="A stream that cannot send one message to its client for this long (the "
        "client reads nothing) is cancelled, and so is its generation; over HTTP, an event "
        "stream or a whole answer the socket cannot take for this long, and its connection "
        "is dropped.",
    )
    max_prompt_bytes: ByteSize = Field(
        default=ByteSize(1 << 20),
        gt=0,
        description="Largest prompt (UTF-8 bytes of `prompt`, or of all message contents).",
    )
    max_tokens_cap: int = Field(
        default=32768, gt=0, description="Largest max_tokens a request may ask for."
    )
    max_messages: int = Field(default=1024, gt=0, description="Most chat messages in one request.")


class ImageSettings(BaseModel):
    """GenerateImage: the default image model, image limits and the external command."""

    default_image_model: str = Field(
        default="",
        description="Model that serves GenerateImage requests which leave `model` empty.",
    )
    image_max_width: int = Field(default=2048, gt=0, description="Largest image width.")
    image_max_height: int = Field(default=2048, gt=0, description="Largest image height.")
    image_max_steps: int = Field(default=100, gt=0, description="Most denoising steps.")
    image_bytes_per_pixel: int = Field(
        default=4096,
        gt=0,
        description="Memory an image request needs per output pixel beyond the weights "
        "(activations), reserved in the memory budget while it renders.",
    )
    image_cancel_seconds: float = Field(
        default=5.0,
        gt=0,
        description="How long an image engine may go on computing an image after its request "
        "was cancelled (the client left, the deadline passed) before the engine is stopped; "
        "the next request starts it afresh. The pipeline stops at the next layer; this "
        "bounds one layer that runs longer (a large image's attention on a CPU).",
    )
    image_output_dir: Path | None = Field(
        default=None,
        description="Also save every generated image here, under a name the server chooses.",
    )
    image_command: str = Field(
        default="mflux-generate",
        description="The external image command (mflux-generate's arguments), a name on "
        "PATH or a path.",
    )
    image_command_managed: Path | None = Field(
        default=None,
        description="A managed copy of the image command, preferred over image_command "
        "whenever it runs.",
    )
    image_command_timeout: float = Field(
        default=900.0, gt=0, description="Seconds one external image generation may take."
    )


# Every setting, one flat object: each section above is a base. pydantic lists a class's
# fields from its last base to its first, so --help reads ServerSettings first. (No
# docstring: it would become the JSON schema's description.)
class Settings(
    ImageSettings, LimitSettings, ModelOptionSettings, PoolSettings, ServerSettings, BaseSettings
):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid")

    @model_validator(mode="after")
    def _check_tls(self) -> Settings:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ValueError("tls_client_ca needs tls_cert and tls_key")
        return self

    @model_validator(mode="after")
    def _size_concurrency_to_the_batch(self) -> Settings:
        """Unless set, enough model-work slots for one model to fill its batch: its
        per-model share (three quarters) of twice the batch still holds the batch,
        and other models keep the rest. A fixed 32 left a --parallel-sequences 128
        model running 24 streams, with the others queued in front of it."""
        if "max_concurrent" not in self.model_fields_set:
            self.max_concurrent = max(32, 2 * self.parallel_sequences)
        return self

    @model_validator(mode="after")
    def _check_pull_on_demand(self) -> Settings:
        if self.pull_on_demand and not self.allow_pull:
            raise ValueError("pull_on_demand needs allow_pull: it pulls, on a client's request")
        return self

    @field_validator("models_dir", mode="before")
    @classmethod
    def _split_models_dir(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part for part in value.split(os.pathsep) if part]
        return value

    @model_validator(mode="after")
    def _merge_models_file(self) -> Settings:
        """Models from --models-file; names also given in `models` keep those settings."""
        if self.models_file is not None:
            from_file = read_models_file(self.models_file)
            self.models = {**from_file, **self.models}
        return self

    @field_validator("hf_redirect_networks")
    @classmethod
    def _check_networks(cls, value: str) -> str:
        for part in value.split(","):  # ValueError names a part that is not a network
            if part.strip():
                ipaddress.ip_network(part.strip(), strict=False)
        return value

    @field_validator("http_cors_origins")
    @classmethod
    def _check_origins(cls, value: str | None) -> str | None:
        cors_origins(value)  # ValueError names an origin that is not one
        return value

    @field_validator("listen", "health_listen", "http_listen")
    @classmethod
    def _check_listen(cls, value: str | None) -> str | None:
        if value is None:
            return value
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"expected HOST:PORT, got {value!r}")
        return value


ANY_ORIGIN = "*"


def cors_origins(setting: str | None) -> frozenset[str]:
    """`--http-cors-origins`: comma-separated origins (scheme://host[:port]) or `*`.
    ValueError names one that is not an origin."""
    origins = frozenset(part.strip() for part in (setting or "").split(",") if part.strip())
    for origin in origins - {ANY_ORIGIN}:
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.path:
            raise ValueError(
                f"{origin!r} is not an origin: write scheme://host[:port], such as "
                "https://app.example.com, with no path, or * for any"
            )
    return origins


def read_models_file(path: Path) -> dict[str, ModelConfig]:
    """A models file: TOML or YAML (by extension), names at the top or under `models`."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"cannot read models file {path}: {exc.strerror}") from exc
    if path.suffix.lower() in (".yaml", ".yml"):
        data = yaml.safe_load(text) or {}
    else:
        data = tomllib.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"models file {path} must map model names to settings")
    entries = data.get("models", data)
    return {str(name): ModelConfig.model_validate(entry) for name, entry in entries.items()}


_CHOICES = (
    "log_format",
    "log_level",
    "flash_attention",
    "kv_layout",
    "sample_in_graph",
    "engine_mode",
)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _parse_model_flag(text: str) -> tuple[str, str]:
    name, sep, source = text.partition("=")
    if not sep or not name or not source:
        raise argparse.ArgumentTypeError(f"expected NAME=SOURCE, got {text!r}")
    return name, source


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="inference-server",
        description="Serve local language and image models over gRPC (package inference.v1).",
        argument_default=argparse.SUPPRESS,  # only flags given on the command line count
        allow_abbrev=False,  # --max-waiting must not quietly mean --max-waiting-sequences
    )
    parser.add_argument(
        "--config",
        type=Path,
        help=f"TOML file with any of the settings below (env {ENV_PREFIX}CONFIG).",
    )
    for name, field in Settings.model_fields.items():
        env = f"{ENV_PREFIX}{name.upper()}"
        description = (field.description or "").rstrip(".").replace("%", "%%")
        help_text = f"{description} (env {env})"
        if name == "models":
            parser.add_argument(
                "--model",
                dest="models",
                action="append",
                type=_parse_model_flag,
                metavar="NAME=SOURCE",
                help=f"{help_text}; repeatable.",
            )
            continue
        if name == "models_dir":
            parser.add_argument(
                "--models-dir",
                dest=name,
                action="append",
                metavar="DIR",
                help=f"{help_text}; repeatable.",
            )
            continue
        default = field.get_default(call_default_factory=True)
        if default is not None and "default:" not in description:
            help_text += f"; default: {default}"
        if field.annotation is bool:
            parser.add_argument(
                _flag(name), dest=name, action=argparse.BooleanOptionalAction, help=help_text
            )
            continue
        choices = getattr(field.annotation, "__args__", None) if name in _CHOICES else None
        parser.add_argument(_flag(name), dest=name, choices=choices, help=f"{help_text}.")
    return parser


def _read_config_file(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as file:
            return tomllib.load(file)
    except OSError as exc:
        raise SystemExit(f"cannot read config file {path}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise SystemExit(f"config file {path} is not valid TOML: {exc}") from exc


def load_settings(argv: Sequence[str] | None = None) -> Settings:
    """Settings from flags, environment and config file, in that precedence."""
    flags = vars(build_parser().parse_args(argv))
    config_path = flags.pop("config", None) or os.environ.get(f"{ENV_PREFIX}CONFIG")
    if "models" in flags:
        flags["models"] = {name: {"source": source} for name, source in flags["models"]}
    values: dict[str, Any] = _read_config_file(Path(config_path)) if config_path else {}
    values.update(EnvSettingsSource(Settings)())
    values.update(flags)
    try:
        return Settings(**values)
    except ValidationError as exc:
        raise SystemExit(f"invalid settings:\n{exc}") from exc
