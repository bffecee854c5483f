"""What the picker knows of each replica, refreshed continuously.

Every `interval` seconds each replica is asked for its health
(`grpc.health.v1`, service `inference.v1.Inference`) and its ListModels (the
models it has loaded and its load). A replica that does not answer, or is not
SERVING (it is draining, or its default model failed to load), is down: the
picker sends it nothing until it answers SERVING again. The replica list is
fixed (`host:port` addresses) or, for Kubernetes, a DNS name resolved again on
every refresh (a headless Service's name gives one address per pod).

A replica's address is its gRPC port's. One written `host:port=http_port` also
serves OpenAI-compatible HTTP on `http_port` of the same host (its
`--http-listen`): HTTP requests are routed to that port (`Replica.http_address`).

After each refresh the monitor publishes `view`, a tuple of frozen
`ReplicaView`s replaced whole, which the metrics thread reads without touching
the dicts this event loop changes; each poll's outcome and time go to `on_poll`.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import grpc
import structlog
from grpc_health.v1 import health_pb2, health_pb2_grpc

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc

log = structlog.get_logger("replicas")

INFERENCE_SERVICE = "inference.v1.Inference"
# Polls in a row that may time out before a replica counts as down.
SLOW_POLLS_DOWN = 3
SERVING = "SERVING"


@dataclass
class Replica:
    """One replica as last seen, plus the requests the picker has sent it since
    (`routed`): those count at once, until the next poll reports them."""

    address: str
    http_port: int | None = None  # its --http-listen port, if the picker was told it
    up: bool = False
    default_model: str = ""
    engines: dict[str, int] = field(default_factory=dict)  # loaded model -> engine pid
    running: int = 0
    waiting: int = 0
    max_running: int = 0
    max_waiting: int = 0
    routed: int = 0
    slow_polls: int = 0  # polls in a row that failed

    @property
    def load(self) -> int:
        return self.running + self.waiting + self.routed

    @property
    def saturated(self) -> bool:
        """It would refuse one more request with RESOURCE_EXHAUSTED."""
        limit = self.max_running + self.max_waiting
        return limit > 0 and self.load >= limit

    def has_loaded(self, model: str) -> bool:
        return (model or self.default_model) in self.engines

    @property
    def http_address(self) -> str | None:
        """HOST:PORT of its OpenAI-compatible HTTP port: its own host, that port."""
        if self.http_port is None:
            return None
        return _join(parse_address(self.address)[0], self.http_port)


@dataclass(frozen=True)
class ReplicaView:
    """A replica as the last refresh left it, for reading from another thread."""

    address: str
    up: bool
    running: int
    waiting: int


def parse_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {address!r}")
    return host.strip("[]"), int(port)


def parse_replica(text: str) -> tuple[str, int | None]:
    """`HOST:PORT` (a replica's gRPC port), or `HOST:PORT=HTTP_PORT` (and its HTTP
    port, on the same host): (HOST:PORT, HTTP_PORT or None)."""
    address, sep, http_port = text.partition("=")
    parse_address(address)
    if not sep:
        return address, None
    if not http_port.isdigit() or not 0 < int(http_port) < 65536:
        raise ValueError(f"expected HOST:PORT=HTTP_PORT, got {text!r}")
    return address, int(http_port)


async def resolve(address: str) -> list[str]:
    """Every IP address a HOST:PORT name resolves to, as IP:PORT (IPv6 in brackets)."""
    host, port = parse_address(address)
    infos = await asyncio.get_running_loop().getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    )
    found = {_join(str(info[4][0]), port) for info in infos}
    return sorted(found)


def _join(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


class ReplicaMonitor:
    """Keeps `replicas` current. `on_lost(address)` is called when a replica's
    prompt cache is gone: it went down, or one of its engines was replaced."""

    def __init__(
        self,
        static: Iterable[str] = (),
        dns: Iterable[str] = (),
        *,
        interval: float = 0.5,
        timeout: float = 1.0,
        token: str | None = None,
        on_lost: Callable[[str], None] = lambda address: None,
        on_poll: Callable[[str, float], None] = lambda outcome, seconds: None,
    ) -> None:
        self.replicas: dict[str, Replica] = {}
        self._static = [parse_replica(text) for text in static]
        self._dns = [parse_replica(text) for text in dns]
        self._http_ports: dict[str, int | None] = {}  # address -> HTTP port, as last found
        self._interval = interval
        self._timeout = timeout
        self._on_lost = on_lost
        self._on_poll = on_poll
        self.view: tuple[ReplicaView, ...] = ()
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._channels: dict[str, grpc.aio.Channel] = {}
        self.refreshed = asyncio.Event()

    async def run(self) -> None:
        """Refresh forever (cancel to stop)."""
        try:
            while True:
                await self.refresh()
                self.refreshed.set()
                await asyncio.sleep(self._interval)
        finally:
            for channel in self._channels.values():
                await channel.close(None)

    async def refresh(self) -> None:
        addresses = await self._addresses()
        for gone in set(self.replicas) - set(addresses):
            self._drop(gone)
        for address in addresses:
            replica = self.replicas.setdefault(address, Replica(address))
            replica.http_port = self._http_ports.get(address)
        await asyncio.gather(*(self._poll(self.replicas[a]) for a in addresses))
        self.view = tuple(
            ReplicaView(r.address, r.up, r.running, r.waiting) for r in self.replicas.values()
        )

    async def _addresses(self) -> list[str]:
        found = [address for address, _ in self._static]
        self._http_ports.update(self._static)
        for name, http_port in self._dns:
            try:
                resolved = await resolve(name)
            except OSError as exc:  # keep what we had: DNS hiccups should not empty the list
                log.warning("cannot resolve replicas", name=name, error=str(exc))
                found += [a for a in self.replicas if a not in found]
                continue
            found += resolved
            self._http_ports.update(dict.fromkeys(resolved, http_port))
        return list(dict.fromkeys(found))

    def _drop(self, address: str) -> None:
        del self.replicas[address]
        self._on_lost(address)
        channel = self._channels.pop(address, None)
        if channel is not None:
            asyncio.get_running_loop().create_task(channel.close(None))

    async def _poll(self, replica: Replica) -> None:
        channel = self._channels.get(replica.address)
        if channel is None:
            channel = self._channels[replica.address] = grpc.aio.insecure_channel(replica.address)
        started = time.perf_counter()
        try:
            health = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=INFERENCE_SERVICE), timeout=self._timeout
            )
            models = await pb_grpc.InferenceStub(channel).ListModels(
                pb.ListModelsRequest(), timeout=self._timeout, metadata=self._metadata
            )
        except grpc.aio.AioRpcError as exc:
            self._on_poll(exc.code().name, time.perf_counter() - started)
            self._failed_poll(replica, exc.code())
            return
        status = health_pb2.HealthCheckResponse.ServingStatus.Name(health.status)
        self._on_poll(status, time.perf_counter() - started)
        if status != SERVING:
            self._mark_down(replica, status)
            return
        self._update(replica, models)

    def _failed_poll(self, replica: Replica, code: grpc.StatusCode) -> None:
        """A refused connection means the replica is gone; a slow answer may only
        mean a busy machine, so it takes `SLOW_POLLS_DOWN` of them in a row."""
        replica.slow_polls += 1
        if code != grpc.StatusCode.DEADLINE_EXCEEDED or replica.slow_polls >= SLOW_POLLS_DOWN:
            self._mark_down(replica, code.name)

    def _mark_down(self, replica: Replica, why: str) -> None:
        if replica.up:
            log.warning("replica down", replica=replica.address, why=why)
            self._on_lost(replica.address)
        replica.up = False

    def _update(self, replica: Replica, answer: pb.ListModelsResponse) -> None:
        engines = {m.name: m.engine_pid for m in answer.models if m.loaded}
        replaced = [m for m, pid in replica.engines.items() if pid and engines.get(m) != pid]
        if replaced or not replica.up:
            self._on_lost(replica.address)
        if not replica.up:
            log.info("replica up", replica=replica.address, models=sorted(engines))
        elif engines.keys() != replica.engines.keys():  # what routing by model now follows
            log.info("replica models", replica=replica.address, models=sorted(engines))
        replica.up = True
        replica.slow_polls = 0
        replica.default_model = answer.default_model
        replica.engines = engines
        load = answer.load
        replica.running, replica.waiting = load.running, load.waiting
        replica.routed = 0  # the replica's own count includes them now
        replica.max_running, replica.max_waiting = load.max_running, load.max_waiting
