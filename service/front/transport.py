"""How the gRPC port is served: channel options (keepalive, message sizes) and TLS
(which the OpenAI-compatible HTTP port shares)."""

from __future__ import annotations

import ssl
from pathlib import Path

import grpc

from service.config import ServerSettings

# Clients behind proxies ping often to keep long streams open; accept pings this often.
MIN_CLIENT_PING_INTERVAL_MS = 10_000


def server_options(settings: ServerSettings) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", int(settings.max_receive_message_bytes)),
        ("grpc.max_send_message_length", int(settings.max_send_message_bytes)),
        ("grpc.keepalive_time_ms", int(settings.keepalive_time * 1000)),
        ("grpc.keepalive_timeout_ms", int(settings.keepalive_timeout * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", MIN_CLIENT_PING_INTERVAL_MS),
        ("grpc.http2.min_ping_interval_without_data_ms", MIN_CLIENT_PING_INTERVAL_MS),
        # One connection cannot open streams without end (each costs memory until it ends).
        ("grpc.max_concurrent_streams", settings.max_streams_per_connection),
    ]


def server_credentials(settings: ServerSettings) -> grpc.ServerCredentials | None:
    """TLS credentials when a certificate is configured (mTLS with a client CA); else None."""
    if settings.tls_cert is None or settings.tls_key is None:
        return None
    key, cert = _read(settings.tls_key), _read(settings.tls_cert)
    client_ca = _read(settings.tls_client_ca) if settings.tls_client_ca else None
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=client_ca, require_client_auth=client_ca is not None
    )


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise SystemExit(f"cannot read {path}: {exc.strerror}") from exc


def http_tls(settings: ServerSettings) -> ssl.SSLContext | None:
    """The same certificate (and client CA, for mTLS) for the HTTP port; None without."""
    if settings.tls_cert is None or settings.tls_key is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(settings.tls_cert, settings.tls_key)
    if settings.tls_client_ca is not None:
        context.load_verify_locations(settings.tls_client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context
