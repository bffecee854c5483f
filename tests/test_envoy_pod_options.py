"""The renderer's options for Envoy in a pod (deploy/kubernetes): the replicas' token
from Envoy's environment, a JSON access log on stdout, and a listener that serves
Envoy's Prometheus statistics and nothing else of its admin interface.

Checked on the real Envoy binary, in front of a stand-in replica's HTTP port on
loopback: what reaches the replica, what Envoy logs, what the stats port answers.
Without the options the configuration is what `make cluster` has always run.
"""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest
import yaml

from service.cluster.envoy_config import layout_from_args, render

ENVOY = Path(sys.executable).with_name("envoy")
TOKEN_ENV = "TEST_REPLICA_TOKEN"
TOKEN = "s3cret-for-this-test"


def pod_options(stats: str) -> list[str]:
    """The options deploy/kubernetes renders with (its ConfigMap's annotation)."""
    return ["--access-log", "--stats-listen", stats, "--replica-token-env", TOKEN_ENV]


# Envoy's own log quiet; the access log flushed every 100 ms (by default every 10 s).
QUIET_AND_PROMPT = ["--log-level", "error", "--file-flush-interval-msec", "100"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_without_the_options_nothing_of_them_is_rendered() -> None:
    plain = render(
        layout_from_args(
            ["--replicas-dns", "replicas:50051=8080", "--http-listen", "0.0.0.0:50061"]
        )
    )
    assert "access_log" not in plain
    assert "ENVIRONMENT" not in plain
    assert "authorization" not in plain
    assert "/stats/prometheus" not in plain


def test_the_token_is_named_never_written() -> None:
    config = render(
        layout_from_args(["--replica", "127.0.0.1:1", "--replica-token-env", "MY_TOKEN"])
    )
    hosts = yaml.safe_load(config)["static_resources"]["listeners"][0]["filter_chains"][0]
    (vhost,) = hosts["filters"][0]["typed_config"]["route_config"]["virtual_hosts"]
    (header,) = vhost["request_headers_to_add"]
    assert header["header"] == {"key": "authorization", "value": "Bearer %ENVIRONMENT(MY_TOKEN)%"}
    assert header["append_action"] == "OVERWRITE_IF_EXISTS_OR_ADD"
    for bad in ("MY TOKEN", "1TOKEN", "A)%"):
        with pytest.raises(ValueError, match="environment variable"):
            layout_from_args(["--replica", "127.0.0.1:1", "--replica-token-env", bad])


def test_the_stats_listener_needs_a_fixed_admin_address() -> None:
    with pytest.raises(ValueError, match="admin address"):
        layout_from_args(
            ["--replica", "127.0.0.1:1", "--stats-listen", "0.0.0.0:9090", "--admin", "127.0.0.1:0"]
        )


class _Replica(http.server.BaseHTTPRequestHandler):
    seen: ClassVar[list[str | None]] = []

    def do_GET(self) -> None:
        type(self).seen.append(self.headers.get("authorization"))
        body = b'{"status": "ok"}'
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def replica_http() -> Iterator[int]:
    _Replica.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Replica)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def _listeners(admin: str) -> dict[str, int]:
    with urllib.request.urlopen(f"http://{admin}/listeners?format=json", timeout=2) as response:
        statuses = json.load(response)["listener_statuses"]
    return {s["name"]: s["local_address"]["socket_address"]["port_value"] for s in statuses}


def test_envoy_sends_the_token_logs_json_and_serves_its_stats_alone(
    tmp_path: Path, replica_http: int
) -> None:
    admin = f"127.0.0.1:{free_port()}"
    args = ["--replica", f"127.0.0.1:{free_port()}={replica_http}", "--picker", "none"]
    args += ["--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0", "--admin", admin]
    config = tmp_path / "envoy.yaml"
    config.write_text(render(layout_from_args(args + pod_options("127.0.0.1:0"))))
    log = tmp_path / "stdout"
    environment = os.environ | {TOKEN_ENV: TOKEN}
    with log.open("w") as stdout:
        envoy = subprocess.Popen(
            [str(ENVOY), "-c", str(config), "--disable-hot-restart", *QUIET_AND_PROMPT],
            stdout=stdout,
            stderr=subprocess.DEVNULL,
            env=environment,
        )
    try:
        deadline = time.monotonic() + 20
        ports: dict[str, int] = {}
        while True:
            assert envoy.poll() is None, "envoy exited"
            try:
                ports = _listeners(admin)
                status, _ = _get(f"http://127.0.0.1:{ports['http']}/health")
                if status == 200:
                    break
            except (OSError, KeyError, ValueError):
                pass
            assert time.monotonic() < deadline, "envoy never forwarded /health"
            time.sleep(0.1)
        assert set(ports) == {"grpc", "http", "stats"}
        status, _ = _get(
            f"http://127.0.0.1:{ports['http']}/v1/models", {"authorization": "Bearer client's"}
        )
        assert status == 200
        assert _Replica.seen
        assert set(_Replica.seen) == {f"Bearer {TOKEN}"}

        stats = f"http://127.0.0.1:{ports['stats']}"
        status, text = _get(f"{stats}/stats/prometheus")
        assert status == 200
        assert "envoy_cluster_upstream_rq" in text
        for path in ("/config_dump", "/stats", "/clusters", "/ready", "/"):
            assert _get(f"{stats}{path}")[0] == 404, path
        deadline = time.monotonic() + 10
        while '"/v1/models"' not in log.read_text():
            assert time.monotonic() < deadline, "no access log line for the request"
            time.sleep(0.1)
    finally:
        envoy.terminate()
        envoy.wait(timeout=10)
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    (models,) = [line for line in lines if line["path"] == "/v1/models"]
    assert models["method"] == "GET"
    assert models["status"] == 200
    assert models["replica"] == f"127.0.0.1:{replica_http}"
    assert TOKEN not in log.read_text()
    assert "client's" not in log.read_text()


def test_envoy_accepts_the_pod_options(tmp_path: Path) -> None:
    args = ["--replicas-dns", "inference-replicas:50051=8080", "--http-listen", "0.0.0.0:50061"]
    config = tmp_path / "envoy.yaml"
    config.write_text(render(layout_from_args(args + pod_options("0.0.0.0:9090"))))
    checked = subprocess.run(
        [str(ENVOY), "--mode", "validate", "-c", str(config), "--log-level", "error"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stderr
