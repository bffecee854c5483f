"""Settings of the endpoint picker and of the `make cluster` launcher: flags
(`--poll-interval`), environment (`INFERENCE_PICKER_POLL_INTERVAL`) or defaults."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, CliApp, SettingsConfigDict

from service.cluster.replicas import parse_replica

LogFormat = Literal["auto", "json", "console"]
LogLevel = Literal["debug", "info", "warning", "error"]


class PickerSettings(BaseSettings):
    """inference-picker: the endpoint picker Envoy asks (ext_proc) where each request goes."""

    model_config = SettingsConfigDict(
        env_prefix="INFERENCE_PICKER_", cli_kebab_case=True, cli_prog_name="inference-picker"
    )

    listen: str = Field(
        default="127.0.0.1:50070", description="Address to serve ext_proc and health on."
    )
    replica: list[str] = Field(
        default_factory=list,
        description="A replica's HOST:PORT (its gRPC port), or HOST:PORT=HTTP_PORT where it "
        "also serves OpenAI-compatible HTTP (its --http-listen port): HTTP requests Envoy "
        "sends go there; repeatable.",
    )
    replicas_dns: list[str] = Field(
        default_factory=list,
        description="NAME:PORT (or NAME:PORT=HTTP_PORT, as --replica) resolved on every "
        "refresh, one replica per address (a Kubernetes headless Service); repeatable.",
    )
    replica_token: SecretStr | None = Field(
        default=None,
        description="Bearer token for asking replicas started with --auth-token their load.",
    )
    poll_interval: float = Field(
        default=0.5, gt=0, description="Seconds between asking each replica its health and load."
    )
    poll_timeout: float = Field(
        default=1.0, gt=0, description="Seconds a replica has to answer before it counts as down."
    )
    balance: int = Field(
        default=8,
        ge=0,
        description="How many more requests than the least busy replica a replica may have "
        "and still win a request for its cached prefix.",
    )
    prefix_capacity: int = Field(
        default=200_000, gt=0, description="Prompt blocks remembered (about 100 bytes each)."
    )
    tie_seed: int | None = Field(
        default=None,
        description="Seed of the draw that orders replicas equal in every other respect "
        "(unset: drawn at start); a seed makes routing reproducible.",
    )
    grace_period: float = Field(default=5.0, ge=0, description="Seconds to drain on SIGTERM.")
    metrics_listen: str | None = Field(
        default=None,
        description="Serve Prometheus metrics over HTTP on HOST:PORT at /metrics (off when unset).",
    )
    health_listen: str | None = Field(
        default=None,
        description="Also serve only grpc.health.v1 on HOST:PORT, for probes that cannot reach "
        "--listen (a kubelet's, when it is on loopback); off when unset.",
    )
    log_format: LogFormat = Field(default="auto", description="JSON or console log lines.")
    log_level: LogLevel = Field(default="info", description="The least severe level written.")

    @field_validator("replica", "replicas_dns")
    @classmethod
    def _replicas(cls, value: list[str]) -> list[str]:
        for text in value:
            parse_replica(text)  # ValueError: pydantic names the flag
        return value


def load_picker_settings(argv: Sequence[str] | None = None) -> PickerSettings:
    return CliApp.run(PickerSettings, cli_args=list(argv) if argv is not None else None)
