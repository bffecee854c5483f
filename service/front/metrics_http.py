"""Serving a Prometheus registry over HTTP (`--metrics-listen`), for the server
(service/front/metrics.py) and the endpoint picker (service/cluster/metrics.py).

Kept apart from the server's metrics so that the picker can use it without
importing the pool and everything behind it.
"""

from __future__ import annotations

from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server


class ServedRegistry:
    """A Prometheus registry of its own, served over HTTP on demand: the server's
    metrics and the picker's (service/cluster/metrics.py) both are one."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._http: WSGIServer | None = None

    def serve(self, listen: str) -> int:
        """Serve /metrics on HOST:PORT ([IPv6]:PORT too); returns the bound port
        (PORT may be 0)."""
        host, _, port = listen.rpartition(":")
        self._http, _ = start_http_server(int(port), host.strip("[]"), registry=self.registry)
        return int(self._http.server_port)

    def stop(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
