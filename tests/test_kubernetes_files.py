"""The Kubernetes manifests in deploy/kubernetes/ against the programs they start.

The manifests are read as the API server reads them (yaml.safe_load_all) and held
against the service's own code: each container's flags go through its program's own
parser, ports and probes must be the ones those flags open, the replicas' memory
follows the service's estimate for the default model, and Envoy's ConfigMap must be
what the renderer writes today and what the real Envoy binary accepts.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import importlib.metadata
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from clients.cli import build_parser as client_parser
from service.admission import Capability, decide
from service.cluster.envoy_config import layout_from_args, render
from service.cluster.launcher import build_parser as launcher_parser
from service.cluster.replicas import parse_replica
from service.cluster.settings import PickerSettings, load_picker_settings
from service.config import ENV_PREFIX, Settings, load_settings
from service.front.server import INFERENCE_SERVICE
from service.memory import MemoryNeed
from service.models.catalog import Catalog
from service.models.pool import memory_need
from service.models.sources import SourceResolver

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy" / "kubernetes"
NAMESPACE = "inference"
IMAGE = "inference-service:latest"
ENVOY = ROOT / ".venv" / "bin" / "envoy"
ARGS_ANNOTATION = "inference-service/envoy-config-args"
SHA_ANNOTATION = "inference-service/envoy-config-sha256"
CONFIG_KEY = "envoy.yaml"
MIB = 1 << 20

# What a replica holds beyond its models' estimate: the server process and its
# engine's own runtime. Measured 2026-12-01 with the default model after a 200-token
# generation: server 97 MiB RSS, engine 270 MiB of which 184 MiB were the weights and
# KV cache, so 183 MiB; rounded up.
RUNTIME_OVERHEAD_BYTES = 192 * MIB

EXPECTED_OBJECTS = {
    ("Namespace", "inference"),
    ("Deployment", "inference-server"),
    ("Service", "inference-replicas"),
    ("PodDisruptionBudget", "inference-server"),
    ("ConfigMap", "inference-envoy"),
    ("Deployment", "inference-envoy"),
    ("Service", "inference"),
}
# Which Deployment's pods each Service (and the PodDisruptionBudget) selects.
SELECTS = {
    ("Service", "inference-replicas"): "inference-server",
    ("Service", "inference"): "inference-envoy",
    ("PodDisruptionBudget", "inference-server"): "inference-server",
}

Manifest = dict[str, Any]


# --- reading the manifests ---------------------------------------------------------


def manifest_files() -> list[Path]:
    return sorted(p for p in DEPLOY.glob("*.yaml") if p.name != "kustomization.yaml")


@pytest.fixture(scope="module")
def objects() -> dict[tuple[str, str], Manifest]:
    found: dict[tuple[str, str], Manifest] = {}
    for path in manifest_files():
        for document in yaml.safe_load_all(path.read_text()):
            key = (document["kind"], document["metadata"]["name"])
            assert key not in found, f"{key} appears twice"
            found[key] = document
    return found


# Kubernetes versions the manifests must be valid for: the newest schema kubernetes-validate
# bundles, and one a year older.
SCHEMA_VERSIONS = (kubernetes_validate.latest_version(), "1.33.0")


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
def test_every_manifest_passes_kubernetes_own_schema_strictly(
    objects: dict[tuple[str, str], Manifest], version: str
) -> None:
    """Types, required fields and (strict) no unknown field, from the API's OpenAPI
    schemas: what `kubectl apply --validate=strict` would refuse fails here."""
    for key, document in objects.items():
        try:
            kubernetes_validate.validate(document, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"{key} against Kubernetes {version}: {error.message}")


def test_the_strict_schema_check_catches_a_misspelt_field(
    objects: dict[tuple[str, str], Manifest],
) -> None:
    broken = copy.deepcopy(objects["Deployment", "inference-server"])
    broken["spec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = "Never"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, SCHEMA_VERSIONS[0], strict=True)


def pod_spec(objects: dict[tuple[str, str], Manifest], deployment: str) -> Manifest:
    spec: Manifest = objects["Deployment", deployment]["spec"]["template"]["spec"]
    return spec


def container(objects: dict[tuple[str, str], Manifest], deployment: str, name: str) -> Manifest:
    found: list[Manifest] = [
        c for c in pod_spec(objects, deployment)["containers"] if c["name"] == name
    ]
    assert len(found) == 1, (deployment, name)
    return found[0]


def container_port(entry: Manifest, name: str) -> int:
    (port,) = [p["containerPort"] for p in entry.get("ports", []) if p["name"] == name]
    return int(port)


def port_of(address: str) -> int:
    return int(address.rpartition(":")[2])


def host_of(address: str) -> str:
    return address.rpartition(":")[0]


def quantity(text: str | int) -> float:
    """A Kubernetes quantity: 512Mi, 2, 500m."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T|m)?", str(text))
    assert match, f"not a quantity: {text!r}"
    scale = {
        None: 1,
        "Ki": 1 << 10,
        "Mi": 1 << 20,
        "Gi": 1 << 30,
        "Ti": 1 << 40,
        "k": 10**3,
        "M": 10**6,
        "G": 10**9,
        "T": 10**12,
        "m": 1e-3,
    }
    return float(match[1]) * scale[match[2]]


def prestop_seconds(entry: Manifest) -> float:
    """How long a container's preStop hook waits: a sleep action, or our exec hook's
    last argument (see envoy-deployment.yaml)."""
    hook = entry["lifecycle"]["preStop"]
    if "sleep" in hook:
        return float(hook["sleep"]["seconds"])
    return float(hook["exec"]["command"][-1])


def probe_tolerance(probe: Manifest) -> float:
    """Seconds of failed probes before the kubelet acts."""
    return float(probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3))


def envoy_flags(args: list[str]) -> dict[str, str]:
    """Envoy's `--name value` pairs (it rejects `--name=value`)."""
    assert len(args) % 2 == 0, args
    pairs = dict(zip(args[::2], args[1::2], strict=True))
    assert all(name.startswith("--") and "=" not in name for name in pairs), args
    return pairs


@pytest.fixture(scope="module")
def clean_environment() -> Iterator[None]:
    """The programs also read INFERENCE_* variables; the manifests set none."""
    with pytest.MonkeyPatch.context() as patch:
        for name in list(os.environ):
            if name.startswith(ENV_PREFIX):
                patch.delenv(name)
        yield


@pytest.fixture(scope="module")
def server_settings(objects, clean_environment) -> Settings:
    entry = container(objects, "inference-server", "inference-server")
    assert entry["command"] == ["inference-server"]
    variables = [e["name"] for e in entry.get("env", [])]
    assert not [v for v in variables if v.startswith(ENV_PREFIX)], "settings go in args"
    return load_settings(entry["args"])  # an unknown or misspelled flag exits here


@pytest.fixture(scope="module")
def picker_settings(objects, clean_environment) -> PickerSettings:
    entry = container(objects, "inference-envoy", "picker")
    assert entry["command"] == ["inference-picker"]
    return load_picker_settings(entry["args"])


@pytest.fixture(scope="module")
def envoy_args(objects) -> list[str]:
    """The renderer's arguments, as the ConfigMap records them."""
    annotations = objects["ConfigMap", "inference-envoy"]["metadata"]["annotations"]
    return shlex.split(annotations[ARGS_ANNOTATION])


def render_flag(args: list[str], name: str) -> str:
    (value,) = [args[i + 1] for i, arg in enumerate(args) if arg == name]
    return value


def envoy_config(objects: dict[tuple[str, str], Manifest]) -> Manifest:
    """The config Envoy reads, parsed: not the arguments it was rendered from."""
    config: Manifest = yaml.safe_load(objects["ConfigMap", "inference-envoy"]["data"][CONFIG_KEY])
    return config


def socket_address(entry: Manifest) -> tuple[str, int]:
    address = entry["socket_address"]
    return address["address"], address["port_value"]


def service_port(objects: dict[tuple[str, str], Manifest], service: str, name: str) -> Manifest:
    (port,) = [p for p in objects["Service", service]["spec"]["ports"] if p["name"] == name]
    return dict(port)


# --- the objects -------------------------------------------------------------------


def test_every_manifest_parses_and_the_kustomization_lists_them(objects) -> None:
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == [p.name for p in manifest_files()]
    assert set(objects) == EXPECTED_OBJECTS
    for (kind, name), document in objects.items():
        assert document["apiVersion"], (kind, name)
        if kind != "Namespace":
            assert document["metadata"]["namespace"] == NAMESPACE, (kind, name)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kustomize_builds_the_same_objects(objects) -> None:
    result = subprocess.run(
        ["kubectl", "kustomize", str(DEPLOY)], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr
    built = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(result.stdout)}
    assert built == objects


def test_every_container_runs_the_one_image_and_an_installed_program(objects) -> None:
    programs = {entry.name for entry in importlib.metadata.entry_points(group="console_scripts")}
    for deployment in ("inference-server", "inference-envoy"):
        for entry in pod_spec(objects, deployment)["containers"]:
            assert entry["image"] == IMAGE, entry["name"]
            assert entry["command"][0] in programs, entry["command"]


def test_selectors_select_the_pods_meant(objects) -> None:
    pod_labels = {}
    for deployment in ("inference-server", "inference-envoy"):
        spec = objects["Deployment", deployment]["spec"]
        labels = spec["template"]["metadata"]["labels"]
        assert spec["selector"]["matchLabels"].items() <= labels.items(), deployment
        pod_labels[deployment] = labels
    for key, meant in SELECTS.items():
        spec = objects[key]["spec"]
        selector = spec["selector"].get("matchLabels", spec["selector"])
        selected = [
            name for name, labels in pod_labels.items() if selector.items() <= labels.items()
        ]
        assert selected == [meant], key


def test_pods_get_no_service_variables_and_no_api_token(objects) -> None:
    # A Service named inference-* would put INFERENCE_* variables in every pod.
    for deployment in ("inference-server", "inference-envoy"):
        spec = pod_spec(objects, deployment)
        assert spec["enableServiceLinks"] is False, deployment
        assert spec["automountServiceAccountToken"] is False, deployment


# --- the replicas ------------------------------------------------------------------


def test_a_misspelled_flag_fails_these_checks(clean_environment) -> None:
    with pytest.raises(SystemExit):
        load_settings(["--grace-periods=60"])
    with pytest.raises(SystemExit):
        load_picker_settings(["--replica-dns=inference-replicas:50051"])


def test_server_ports_are_the_ones_its_flags_open(objects, server_settings) -> None:
    entry = container(objects, "inference-server", "inference-server")
    settings = server_settings
    assert settings.health_listen is not None
    assert settings.metrics_listen is not None
    assert settings.http_listen is not None, "Envoy's HTTP listener forwards to it"
    for name, address in (
        ("grpc", settings.listen),
        ("health", settings.health_listen),
        ("metrics", settings.metrics_listen),
        ("http", settings.http_listen),
    ):
        assert host_of(address) == "0.0.0.0", f"{name}: the kubelet and Envoy dial the pod IP"
        assert container_port(entry, name) == port_of(address), name
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert entry[kind]["grpc"]["port"] == port_of(settings.health_listen), kind


def test_readiness_asks_for_the_inference_service(objects) -> None:
    """It turns NOT_SERVING while the default model is not loaded and while draining."""
    entry = container(objects, "inference-server", "inference-server")
    assert entry["readinessProbe"]["grpc"]["service"] == INFERENCE_SERVICE
    assert entry["startupProbe"]["grpc"]["service"] == INFERENCE_SERVICE


def test_replicas_outlive_their_drain(objects, server_settings) -> None:
    spec = pod_spec(objects, "inference-server")
    entry = container(objects, "inference-server", "inference-server")
    pause = prestop_seconds(entry)
    grace = spec["terminationGracePeriodSeconds"]
    assert grace > pause + server_settings.grace_period
    # Health is NOT_SERVING from SIGTERM until the kill: liveness must not act first.
    assert probe_tolerance(entry["livenessProbe"]) > grace - pause


def test_headless_service_reaches_the_replicas(
    objects, server_settings, picker_settings, envoy_args
) -> None:
    service = objects["Service", "inference-replicas"]
    spec = service["spec"]
    assert spec["clusterIP"] == "None"
    assert spec["publishNotReadyAddresses"] is False
    entry = container(objects, "inference-server", "inference-server")
    (grpc_port,) = [p for p in spec["ports"] if p["name"] == "grpc"]
    # Headless: Envoy and the picker dial each pod's IP at the port they are given.
    assert grpc_port["port"] == container_port(entry, grpc_port["targetPort"])
    assert grpc_port["port"] == port_of(server_settings.listen)
    for port in spec["ports"]:
        assert container_port(entry, port["targetPort"]) == port["port"], port["name"]
    fqdn = f"{service['metadata']['name']}.{NAMESPACE}.svc.cluster.local:{grpc_port['port']}"
    (picker_replicas,) = picker_settings.replicas_dns
    assert parse_replica(picker_replicas)[0] == fqdn
    assert picker_settings.replica == []
    assert parse_replica(render_flag(envoy_args, "--replicas-dns"))[0] == fqdn


def test_picker_and_envoy_send_http_to_the_replicas_http_port(
    objects, server_settings, picker_settings, envoy_args
) -> None:
    """NAME:PORT=HTTP_PORT. Without the HTTP port the picker places no HTTP request and
    the renderer writes no HTTP cluster; a wrong one sends them to a closed port."""
    assert server_settings.http_listen is not None
    http_port = port_of(server_settings.http_listen)
    # Headless: Envoy dials each pod's IP at this port, whatever targetPort says.
    assert service_port(objects, "inference-replicas", "http")["port"] == http_port
    (picker_replicas,) = picker_settings.replicas_dns
    assert parse_replica(picker_replicas)[1] == http_port
    assert render_flag(envoy_args, "--replicas-dns") == picker_replicas
    (cluster,) = [
        c
        for c in envoy_config(objects)["static_resources"]["clusters"]
        if c["name"] == "replicas_http"
    ]
    (endpoints,) = cluster["load_assignment"]["endpoints"]
    (endpoint,) = endpoints["lb_endpoints"]
    replicas_host = host_of(parse_replica(picker_replicas)[0])
    assert socket_address(endpoint["endpoint"]["address"]) == (replicas_host, http_port)


@pytest.fixture(scope="module")
def default_model_need(server_settings) -> MemoryNeed:
    """The service's own estimate for the default model at the replicas' settings.

    The pods get no GPU, so none of it is offloaded, whichever llama.cpp build runs
    this test."""
    settings = server_settings
    catalog = Catalog(settings, SourceResolver(settings.models_dir, settings.hf_cache_dir))
    spec = catalog.resolve(settings.default_model)
    decision = decide(spec.locate(), Capability.TEXT, offline=True)
    assert decision.admitted, decision.reason
    return memory_need(dataclasses.replace(decision, offloads=False), spec)


def test_memory_follows_the_default_models_estimate(
    objects, server_settings, default_model_need
) -> None:
    entry = container(objects, "inference-server", "inference-server")
    need = default_model_need.host_bytes
    budget = server_settings.memory_budget
    # Without it the budget is 80% of the node's available memory, not the pod's.
    assert budget is not None
    assert budget >= need, "the default model would never load: the replica never gets ready"
    request = quantity(entry["resources"]["requests"]["memory"])
    limit = quantity(entry["resources"]["limits"]["memory"])
    assert request >= budget + RUNTIME_OVERHEAD_BYTES
    queued = server_settings.max_concurrent + server_settings.max_queue
    assert limit - request >= queued * server_settings.max_prompt_bytes
    documented = f"the service estimates {round(need / MIB)} MiB"
    assert documented in (DEPLOY / "server-deployment.yaml").read_text(), "update the comment"


def test_threads_are_the_cpus_requested(objects, server_settings) -> None:
    entry = container(objects, "inference-server", "inference-server")
    # Unset, --threads is the pod's CPU affinity: every core of the node.
    assert any(arg.startswith("--threads") for arg in entry["args"])
    assert server_settings.threads == quantity(entry["resources"]["requests"]["cpu"])


# --- Envoy and the picker ----------------------------------------------------------


def test_picker_listens_where_envoy_looks_and_its_probe_asks_there(
    objects, picker_settings, envoy_args
) -> None:
    assert picker_settings.listen == render_flag(envoy_args, "--picker")
    assert host_of(picker_settings.listen) == "127.0.0.1"
    entry = container(objects, "inference-envoy", "picker")
    command = entry["livenessProbe"]["exec"]["command"]
    assert command[0] == "inference-client"
    probe = client_parser().parse_args(command[1:])
    assert (probe.command, probe.target, probe.service) == ("health", picker_settings.listen, "")
    assert "readinessProbe" not in entry, "Envoy serves without the picker"


def test_envoy_listens_where_the_service_points(objects, envoy_args) -> None:
    listen = render_flag(envoy_args, "--listen")
    assert host_of(listen) == "0.0.0.0"
    entry = container(objects, "inference-envoy", "envoy")
    assert container_port(entry, "grpc") == port_of(listen)
    service = objects["Service", "inference"]["spec"]
    assert service.get("type", "ClusterIP") == "ClusterIP"
    port = service_port(objects, "inference", "grpc")
    assert container_port(entry, port["targetPort"]) == port["port"] == port_of(listen)
    assert entry["readinessProbe"]["grpc"] == {
        "port": port_of(listen),
        "service": INFERENCE_SERVICE,
    }
    assert entry["livenessProbe"]["tcpSocket"]["port"] == port_of(listen)
    admin = render_flag(envoy_args, "--admin")
    assert host_of(admin) == "127.0.0.1", "Envoy's admin must stay off the pod network"


def test_envoy_serves_http_where_the_service_points(objects, envoy_args) -> None:
    listen = render_flag(envoy_args, "--http-listen")
    assert host_of(listen) == "0.0.0.0"
    entry = container(objects, "inference-envoy", "envoy")
    port = service_port(objects, "inference", "http")
    assert container_port(entry, port["targetPort"]) == port["port"] == port_of(listen)


def test_clients_use_the_ports_make_cluster_uses(objects) -> None:
    """A client's address in the cluster differs from its `make cluster` one in the host."""
    launcher = launcher_parser()
    for name, flag in (("grpc", "listen"), ("http", "http_listen")):
        wanted = port_of(launcher.get_default(flag))
        assert service_port(objects, "inference", name)["port"] == wanted, name


def test_every_port_the_service_publishes_is_an_envoy_listener(objects) -> None:
    """By name and port, in the config Envoy reads: a published port with no listener
    behind it, or a listener clients cannot reach, fails here."""
    listeners = {
        listener["name"]: socket_address(listener["address"])
        for listener in envoy_config(objects)["static_resources"]["listeners"]
    }
    published = {
        port["name"]: ("0.0.0.0", port["port"])
        for port in objects["Service", "inference"]["spec"]["ports"]
    }
    assert listeners == published


def test_envoy_reads_the_configmap(objects) -> None:
    spec = pod_spec(objects, "inference-envoy")
    entry = container(objects, "inference-envoy", "envoy")
    path = Path(envoy_flags(entry["args"])["--config-path"])
    (mount,) = entry["volumeMounts"]
    assert Path(mount["mountPath"]) == path.parent
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    assert volume["configMap"]["name"] == "inference-envoy"
    assert path.name in objects["ConfigMap", "inference-envoy"]["data"]


def test_envoy_pod_outlives_its_drain(objects, envoy_args, picker_settings) -> None:
    spec = pod_spec(objects, "inference-envoy")
    envoy = container(objects, "inference-envoy", "envoy")
    picker = container(objects, "inference-envoy", "picker")
    grace = spec["terminationGracePeriodSeconds"]
    assert grace > prestop_seconds(envoy)
    assert grace > prestop_seconds(picker) + picker_settings.grace_period
    assert prestop_seconds(picker) >= prestop_seconds(envoy), "Envoy asks the picker meanwhile"
    # The listener closes --drain-time-s into the hook; liveness must not act first.
    assert probe_tolerance(envoy["livenessProbe"]) > prestop_seconds(envoy)
    command = envoy["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:2] == ["python", "-c"]
    assert command[3] == render_flag(envoy_args, "--admin")


def test_configmap_is_what_the_renderer_writes(objects, envoy_args) -> None:
    config = objects["ConfigMap", "inference-envoy"]["data"][CONFIG_KEY]
    assert config == render(layout_from_args(envoy_args)), (
        "stale: run .venv/bin/python deploy/kubernetes/render_envoy_configmap.py"
    )
    annotations = objects["Deployment", "inference-envoy"]["spec"]["template"]["metadata"]
    assert annotations["annotations"][SHA_ANNOTATION] == hashlib.sha256(config.encode()).hexdigest()


def test_render_script_finds_nothing_stale() -> None:
    script = DEPLOY / "render_envoy_configmap.py"
    result = subprocess.run(
        [sys.executable, str(script), "--check"], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr


# --- the real Envoy ----------------------------------------------------------------


def envoy_command(objects, config: Path, **replace: str) -> list[str]:
    """The envoy container's command line, reading `config`, with some flags replaced."""
    entry = container(objects, "inference-envoy", "envoy")
    flags = envoy_flags(entry["args"]) | {"--config-path": str(config)} | replace
    return [str(ENVOY), *(part for pair in flags.items() for part in pair)]


def test_envoy_accepts_the_config_and_the_flags(objects, tmp_path) -> None:
    # Validate mode builds every listener and cluster but resolves no DNS name: the
    # replicas' FQDN exists only inside the cluster, and this passes where it does not
    # resolve.
    config = tmp_path / CONFIG_KEY
    config.write_text(objects["ConfigMap", "inference-envoy"]["data"][CONFIG_KEY])
    command = envoy_command(objects, config)
    result = subprocess.run(
        [*command, "--mode", "validate"], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "OK" in result.stdout


def test_envoy_rejects_a_broken_config(objects, tmp_path) -> None:
    text = objects["ConfigMap", "inference-envoy"]["data"][CONFIG_KEY]
    assert "type: STRICT_DNS" in text
    config = tmp_path / CONFIG_KEY
    config.write_text(text.replace("type: STRICT_DNS", "type: STRICTER_DNS"))
    result = subprocess.run(
        [str(ENVOY), "--mode", "validate", "--config-path", str(config)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode != 0
    assert "OK" not in result.stdout


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=2) as response:
        text: str = response.read().decode()
        return text


def _refuses(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


def test_envoy_prestop_hook_drains_envoy(objects, envoy_args, tmp_path) -> None:
    """The hook, run as written against a real Envoy started with the pod's flags
    (drain time cut to 1 s), starts the drain: the gRPC and HTTP listeners then close."""
    args = list(envoy_args)
    for flag in ("--listen", "--http-listen", "--admin"):
        args[args.index(flag) + 1] = "127.0.0.1:0"
    config = tmp_path / CONFIG_KEY
    config.write_text(render(layout_from_args(args)))
    admin_file = tmp_path / "admin"
    command = envoy_command(objects, config, **{"--drain-time-s": "1"})
    command += ["--admin-address-path", str(admin_file), "--disable-hot-restart"]
    envoy = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not admin_file.exists() or not admin_file.read_text().strip():
            assert envoy.poll() is None, "envoy exited"
            assert time.monotonic() < deadline, "envoy did not start"
            time.sleep(0.05)
        admin = admin_file.read_text().strip()
        listeners = _get(f"http://{admin}/listeners").split()  # NAME::127.0.0.1:PORT each
        assert sorted(name.partition("::")[0] for name in listeners) == ["grpc", "http"]
        ports = [port_of(listener) for listener in listeners]
        # Listed is not yet accepting: Envoy's workers start the listeners a moment later.
        deadline = time.monotonic() + 5
        while any(_refuses(port) for port in ports):
            assert time.monotonic() < deadline, "a listener never opened"
            time.sleep(0.05)
        hook = container(objects, "inference-envoy", "envoy")["lifecycle"]["preStop"]
        _python, flag, code, _admin, _seconds = hook["exec"]["command"]
        result = subprocess.run(
            [sys.executable, flag, code, admin, "0"], capture_output=True, text=True, timeout=10
        )
        assert result.returncode == 0, result.stderr
        deadline = time.monotonic() + 5
        while not all(_refuses(port) for port in ports):
            assert time.monotonic() < deadline, "a listener stayed open"
            time.sleep(0.1)
    finally:
        envoy.kill()
        envoy.wait(timeout=10)
