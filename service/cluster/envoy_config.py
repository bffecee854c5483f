"""The Envoy configuration for many replicas, rendered from `envoy.yaml.j2`.

    python -m service.cluster.envoy_config --listen 0.0.0.0:50060 \\
        --replica 10.0.0.5:50051 --replica 10.0.0.6:50051 --picker 127.0.0.1:50070

or, in Kubernetes, `--replicas-dns inference-replicas:50051` (a headless
Service: Envoy resolves it to one endpoint per pod; a short name resolves in the
pod's own namespace, through the search domains of its resolv.conf).

With `--http-listen HOST:PORT` Envoy also serves the replicas' OpenAI-compatible
HTTP there, through the same picker: name each replica's HTTP port too, as
`--replica 10.0.0.5:50051=8080` (or `--replicas-dns NAME:50051=8080`), and give
the picker the same replica arguments.

For a pod: `--access-log` writes one JSON line per request to stdout,
`--stats-listen HOST:PORT` serves Envoy's Prometheus statistics there (the admin
interface's /stats/prometheus alone), and `--replica-token-env NAME` sends the
replicas `authorization: Bearer $NAME`, read from Envoy's environment.

Browsers: the gRPC listener also speaks grpc-web (HTTP/1.1 or HTTP/2), and
`--cors-origins https://app.example,...` (or `*`) lets pages of those origins
call both listeners; without it, none may.
"""

from __future__ import annotations

import argparse
import base64
import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import jinja2

from service.cluster.replicas import parse_address, parse_replica
from service.config import ANY_ORIGIN, cors_origins

TEMPLATE = Path(__file__).with_name("envoy.yaml.j2")
# The RPCs the picker places; the rest go where Envoy's least-request sends them.
ROUTED_METHODS = ("Generate", "GenerateImage", "Admit")
# The OpenAI-compatible HTTP paths the picker places, and the method each names to it.
HTTP_ROUTES = (("/v1/chat/completions", "ChatCompletions"), ("/v1/completions", "Completions"))
DESCRIPTOR_SET = "inference.binpb"  # in the inference.v1 package
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Address:
    host: str
    port: int

    @classmethod
    def parse(cls, text: str) -> Address:
        return cls(*parse_address(text))

    @property
    def is_ip(self) -> bool:
        try:
            ipaddress.ip_address(self.host)
        except ValueError:
            return False
        return True


@dataclass(frozen=True)
class Endpoints:
    """A cluster's members: fixed IP addresses, or DNS names Envoy resolves."""

    addresses: list[Address]

    @property
    def kind(self) -> str:
        return "STATIC" if all(a.is_ip for a in self.addresses) else "STRICT_DNS"


@dataclass(frozen=True)
class HttpLayout:
    """Envoy's OpenAI-compatible HTTP listener, and each replica's HTTP port: the
    replica's host, in the order of EnvoyLayout.replicas."""

    listen: Address
    ports: tuple[int, ...]
    # gRPC-JSON transcoding of the contract's /inference/v1/... paths on this listener.
    transcode: bool = False


@dataclass(frozen=True)
class EnvoyLayout:
    listen: Address
    replicas: Endpoints
    picker: Address | None  # None: Envoy's least-request alone, no endpoint picker
    admin: Address = field(default_factory=lambda: Address("127.0.0.1", 9901))
    retries: int = 2
    health_interval: float = 1.0
    picker_timeout_ms: int = 200
    stream_idle_timeout: int = 900
    http: HttpLayout | None = None  # None: gRPC only
    access_log: bool = False  # one JSON line per request on stdout
    stats: Address | None = None  # None: Envoy's statistics on the admin address alone
    # An environment variable of Envoy's holding the replicas' --auth-token: sent to
    # them as `authorization: Bearer ...` in place of whatever the client sent.
    replica_token_env: str | None = None
    # Origins whose browser pages may call Envoy's listeners (ANY_ORIGIN: all); empty: none.
    cors_origins: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.http is not None and len(self.http.ports) != len(self.replicas.addresses):
            raise ValueError("an HTTP listener needs every replica's HTTP port")
        if self.stats is not None and not (self.admin.is_ip and self.admin.port):
            raise ValueError("a stats listener needs the admin address as IP:PORT, port not 0")
        if self.replica_token_env is not None and not ENV_NAME.fullmatch(self.replica_token_env):
            raise ValueError(f"not an environment variable's name: {self.replica_token_env!r}")


def render(layout: EnvoyLayout) -> str:
    environment = jinja2.Environment(
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False
    )
    template = environment.from_string(TEMPLATE.read_text())
    http = layout.http
    return template.render(
        listen=layout.listen,
        admin=layout.admin,
        replicas=layout.replicas,
        picker=layout.picker
        and {
            "kind": Endpoints([layout.picker]).kind,
            "address": layout.picker,
        },
        retries=layout.retries,
        health_interval=layout.health_interval,
        picker_timeout_ms=layout.picker_timeout_ms,
        stream_idle_timeout=layout.stream_idle_timeout,
        routed_methods=ROUTED_METHODS,
        log_requests=layout.access_log,
        stats=layout.stats,
        replica_token_env=layout.replica_token_env,
        cors=_cors(layout.cors_origins),
        http=http
        and {
            "listen": http.listen,
            "routes": HTTP_ROUTES,
            "transcode": http.transcode,
            "descriptor": descriptor_set_base64() if http.transcode else "",
            "replicas": [
                Address(address.host, port)
                for address, port in zip(layout.replicas.addresses, http.ports, strict=True)
            ],
        },
    )


def descriptor_set_base64() -> str:
    """The contract's descriptor set (`make protos` writes it as package data), as
    Envoy's proto_descriptor_bin takes it: inline, so the config needs no file."""
    data = resources.files("inference.v1").joinpath(DESCRIPTOR_SET).read_bytes()
    return base64.b64encode(data).decode("ascii")


def _cors(origins: frozenset[str]) -> dict[str, object] | None:
    if not origins:
        return None
    return {"any": ANY_ORIGIN in origins, "origins": sorted(origins)}


def parse_cors_origins(text: str | None) -> frozenset[str]:
    """`--cors-origins`, the servers' --http-cors-origins syntax; SystemExit names a bad one."""
    try:
        return cors_origins(text)
    except ValueError as exc:
        raise SystemExit(f"--cors-origins: {exc}") from exc


CORS_HELP = (
    "Origins (scheme://host[:port], comma-separated, or *) whose browser pages may call "
    "Envoy's listeners: gRPC-web and the HTTP API (default: none)."
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m service.cluster.envoy_config",
        description="Write the Envoy configuration for replicas behind the endpoint picker.",
        allow_abbrev=False,
    )
    parser.add_argument("--listen", default="127.0.0.1:50060", help="Envoy's gRPC HOST:PORT.")
    parser.add_argument(
        "--http-listen",
        default=None,
        metavar="HOST:PORT",
        help="Envoy's OpenAI-compatible HTTP HOST:PORT (default: none, gRPC only); every "
        "replica then needs its HTTP port, HOST:PORT=HTTP_PORT.",
    )
    parser.add_argument(
        "--replica",
        action="append",
        default=[],
        help="A replica's HOST:PORT, or HOST:PORT=HTTP_PORT; repeatable.",
    )
    parser.add_argument(
        "--replicas-dns",
        action="append",
        default=[],
        help="NAME:PORT (or NAME:PORT=HTTP_PORT) of all replicas.",
    )
    parser.add_argument(
        "--picker", default="127.0.0.1:50070", help="The picker's HOST:PORT ('none': no picker)."
    )
    parser.add_argument("--admin", default="127.0.0.1:9901", help="Envoy's admin HOST:PORT.")
    parser.add_argument("--retries", type=int, default=2, help="Retries of a refused request.")
    parser.add_argument(
        "--access-log", action="store_true", help="Log each request to stdout, one JSON line."
    )
    parser.add_argument(
        "--stats-listen",
        default=None,
        metavar="HOST:PORT",
        help="Serve Envoy's Prometheus statistics at /stats/prometheus on HOST:PORT (only "
        "that path of the admin interface; default: none).",
    )
    parser.add_argument(
        "--replica-token-env",
        default=None,
        metavar="NAME",
        help="Send the replicas `authorization: Bearer $NAME`, NAME read from Envoy's "
        "environment when it starts, in place of any the client sent (their --auth-token).",
    )
    parser.add_argument(
        "--transcode",
        action="store_true",
        help="Also serve the contract as JSON on the HTTP listener (gRPC-JSON transcoding: "
        "POST /inference/v1/generate, GET /inference/v1/models, ...); needs --http-listen.",
    )
    parser.add_argument("--cors-origins", default=None, metavar="ORIGINS", help=CORS_HELP)
    return parser


def layout_from_args(argv: Sequence[str] | None = None) -> EnvoyLayout:
    args = build_parser().parse_args(argv)
    try:
        specs = [parse_replica(text) for text in args.replica + args.replicas_dns]
    except ValueError as exc:
        raise SystemExit(str(exc)) from exc
    if not specs:
        raise SystemExit("name the replicas: --replica HOST:PORT or --replicas-dns NAME:PORT")
    http = None
    if args.http_listen:
        ports = [port for _, port in specs if port is not None]
        if len(ports) != len(specs):
            raise SystemExit("--http-listen: name every replica's HTTP port, HOST:PORT=HTTP_PORT")
        http = HttpLayout(Address.parse(args.http_listen), tuple(ports), args.transcode)
    elif args.transcode:
        raise SystemExit("--transcode: it serves on the HTTP listener; give --http-listen")
    return EnvoyLayout(
        listen=Address.parse(args.listen),
        replicas=Endpoints([Address.parse(address) for address, _ in specs]),
        picker=None if args.picker == "none" else Address.parse(args.picker),
        admin=Address.parse(args.admin),
        retries=args.retries,
        http=http,
        access_log=args.access_log,
        stats=Address.parse(args.stats_listen) if args.stats_listen else None,
        replica_token_env=args.replica_token_env,
        cors_origins=parse_cors_origins(args.cors_origins),
    )


def main(argv: Sequence[str] | None = None) -> None:
    print(render(layout_from_args(argv)), end="")


if __name__ == "__main__":
    main()
