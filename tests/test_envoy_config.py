"""What the renderer writes for a mesh, browsers and JSON clients (issue 46): no
Envoy-side deadline, grpc-web before the picker on a listener that takes HTTP/1.1 too,
a CORS policy only for the origins named, and the transcoder with the package's own
descriptor set. The real Envoy accepts it (validate mode); test_cluster_mesh.py runs it.
"""

from __future__ import annotations

import base64
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from google.protobuf import descriptor_pb2

from service.cluster.envoy_config import layout_from_args, render
from service.cluster.launcher import parse_args

ENVOY = Path(sys.executable).with_name("envoy")
REPLICAS = ["--replica", "127.0.0.1:50100=50200", "--replica", "127.0.0.1:50101=50201"]
HTTP = ["--http-listen", "127.0.0.1:50061"]


def _config(*args: str) -> dict[str, Any]:
    return dict(yaml.safe_load(render(layout_from_args([*REPLICAS, *args]))))


def _listener(config: dict[str, Any], name: str) -> dict[str, Any]:
    (listener,) = (x for x in config["static_resources"]["listeners"] if x["name"] == name)
    return dict(listener["filter_chains"][0]["filters"][0]["typed_config"])


def _filters(manager: dict[str, Any]) -> list[str]:
    return [f["name"] for f in manager["http_filters"]]


def _virtual_host(manager: dict[str, Any]) -> dict[str, Any]:
    return dict(manager["route_config"]["virtual_hosts"][0])


def test_envoy_leaves_the_deadline_to_the_replica() -> None:
    """`max_stream_duration` on a route made Envoy enforce grpc-timeout itself and
    reset started streams (INTERNAL for the client)."""
    config = _config(*HTTP, "--transcode")
    for name in ("grpc", "http"):
        routes = _virtual_host(_listener(config, name))["routes"]
        assert routes
        for route in routes:
            assert "max_stream_duration" not in route["route"], route["match"]
            assert route["route"]["timeout"] == "0s"


def test_the_grpc_listener_takes_grpc_web_before_the_picker_reads_the_body() -> None:
    manager = _listener(_config(), "grpc")
    assert manager["codec_type"] == "AUTO"  # HTTP/1.1 for browsers, HTTP/2 for gRPC
    filters = _filters(manager)
    assert filters.index("envoy.filters.http.grpc_web") < filters.index(
        "envoy.filters.http.ext_proc"
    )
    assert filters[-1] == "envoy.filters.http.router"


def test_no_cors_policy_without_origins() -> None:
    config = _config(*HTTP)
    for name in ("grpc", "http"):
        manager = _listener(config, name)
        assert "envoy.filters.http.cors" not in _filters(manager)
        assert "typed_per_filter_config" not in _virtual_host(manager)


def _cors_policy(manager: dict[str, Any]) -> dict[str, Any]:
    per_filter = _virtual_host(manager)["typed_per_filter_config"]
    return dict(per_filter["envoy.filters.http.cors"])


def test_cors_allows_exactly_the_named_origins_on_both_listeners() -> None:
    config = _config(*HTTP, "--cors-origins", "https://app.example, http://localhost:3000")
    for name in ("grpc", "http"):
        manager = _listener(config, name)
        assert _filters(manager)[0] == "envoy.filters.http.cors"
        policy = _cors_policy(manager)
        assert policy["allow_origin_string_match"] == [
            {"exact": "http://localhost:3000"},
            {"exact": "https://app.example"},
        ]
        exposed = {h.strip() for h in policy["expose_headers"].split(",")}
        assert {"grpc-status", "grpc-message", "x-inference-replica"} <= exposed
        assert policy["forward_not_matching_preflights"] is False
    (matcher,) = _cors_policy(_listener(_config("--cors-origins", "*"), "grpc"))[
        "allow_origin_string_match"
    ]
    assert matcher == {"safe_regex": {"regex": ".*"}}


@pytest.mark.parametrize("origins", ["ftp://app.example", "app.example", "https://a.example/x"])
def test_a_bad_origin_is_refused_by_both_commands(origins: str) -> None:
    with pytest.raises(SystemExit, match="--cors-origins"):
        layout_from_args([*REPLICAS, "--cors-origins", origins])
    with pytest.raises(SystemExit, match="--cors-origins"):
        parse_args(["--cors-origins", origins])


def test_transcoding_carries_the_package_s_descriptor_set_and_needs_the_http_listener() -> None:
    with pytest.raises(SystemExit, match="--http-listen"):
        layout_from_args([*REPLICAS, "--transcode"])
    assert "envoy.filters.http.grpc_json_transcoder" not in _filters(
        _listener(_config(*HTTP), "http")
    )
    manager = _listener(_config(*HTTP, "--transcode"), "http")
    filters = _filters(manager)
    transcoder = manager["http_filters"][filters.index("envoy.filters.http.grpc_json_transcoder")]
    assert filters.index("envoy.filters.http.grpc_json_transcoder") < filters.index(
        "envoy.filters.http.ext_proc"
    )
    settings = transcoder["typed_config"]
    assert settings["services"] == ["inference.v1.Inference"]
    assert settings["print_options"]["stream_newline_delimited"] is True
    descriptors = descriptor_pb2.FileDescriptorSet.FromString(
        base64.b64decode(settings["proto_descriptor_bin"])
    )
    services = {
        f"{file.package}.{service.name}" for file in descriptors.file for service in file.service
    }
    assert "inference.v1.Inference" in services
    paths = {route["match"].get("path") for route in _virtual_host(manager)["routes"]}
    assert "/inference.v1.Inference/Generate" in paths  # placed by the picker


def test_the_launcher_s_internal_ports_are_free_unless_named() -> None:
    args = parse_args([])
    assert args.picker_listen == "127.0.0.1:0"
    assert args.envoy_admin == "127.0.0.1:0"
    assert args.cors_origins == frozenset()
    named = parse_args(["--picker-listen", "127.0.0.1:50070", "--envoy-admin", "127.0.0.1:9901"])
    assert (named.picker_listen, named.envoy_admin) == ("127.0.0.1:50070", "127.0.0.1:9901")


def test_envoy_accepts_grpc_web_cors_and_transcoding(tmp_path: Path) -> None:
    path = tmp_path / "envoy.yaml"
    path.write_text(
        render(layout_from_args([*REPLICAS, *HTTP, "--transcode", "--cors-origins", "*"]))
    )
    done = subprocess.run(
        [str(ENVOY), "--mode", "validate", "-c", str(path), "--log-level", "error"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
