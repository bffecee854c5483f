"""The process: a grpc.aio server with the Inference, health and reflection services.

Start-up binds the port (TLS when a certificate is configured), reports
NOT_SERVING, loads the default model in the background, then reports SERVING,
for the empty service name and for inference.v1.Inference alike. An optional
second port serves health alone, plaintext, for probes that cannot speak TLS.
SIGTERM or SIGINT drains: health turns NOT_SERVING, new RPCs are refused,
in-flight ones get the grace period to finish, then the process exits 0.
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from inference.v1 import inference_pb2 as pb
from service.admission import Capability, Decision, decide
from service.config import Settings, cors_origins, load_settings
from service.front.auth import BearerAuth
from service.front.descriptors import AcceptErrorLog, http_connection_cap
from service.front.limits import RequestLimits
from service.front.metrics import Metrics
from service.front.offload import Offload
from service.front.openai_api.app import (
    OpenAiHttp,
    below_grpc,
    embed_below_grpc,
    tokenizer_below_grpc,
)
from service.front.openai_api.body import BodyLimits
from service.front.openai_api.connections import ConnectionLimits
from service.front.overload import ConcurrencyGate
from service.front.registration import add_inference_service
from service.front.servicer import InferenceServicer
from service.front.transport import http_tls, server_credentials, server_options
from service.hub.addresses import parse_networks
from service.hub.client import HubAccess
from service.hub.pull import Puller
from service.hub.work import HubWork
from service.images.external import CommandResolver
from service.images.requests import ImageLimits
from service.log import configure_logging
from service.memory import default_budget_bytes
from service.model_source import ModelSource
from service.models.catalog import Catalog
from service.models.engine_starter import engine_starter
from service.models.pool import ModelPool, PoolLimits
from service.models.sources import SourceResolver
from service.scratch import check_temporary_directory
from service.serving.health import BoundedHealthServicer
from service.serving.images import ImageGenerator
from service.serving.pulls import Pulls
from service.serving.text import TextGenerator
from service.text.requests import GenerationLimits

log = structlog.get_logger("server")
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING

INFERENCE_SERVICE = pb.DESCRIPTOR.services_by_name["Inference"].full_name
SERVICE_NAMES = (INFERENCE_SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME)


def build_pool(settings: Settings) -> ModelPool:
    resolver = SourceResolver(settings.models_dir, settings.hf_cache_dir)
    limits = PoolLimits(
        budget_bytes=settings.memory_budget or default_budget_bytes(),
        device_budget_bytes=settings.gpu_memory_budget,
        max_models=settings.max_loaded_models,
        keep_alive=settings.keep_alive,
        load_wait=settings.load_wait,
        max_waiting_sequences=settings.max_waiting_sequences,
        crash_limit=settings.engine_crash_limit,
        crash_window=settings.engine_crash_window,
    )

    hub = _hub_access(settings)

    def admit(source: ModelSource, capability: Capability) -> Decision:
        return decide(
            source,
            capability,
            offline=settings.hf_offline,
            hub=hub,
            hub_cache=settings.hf_cache_dir,
        )

    return ModelPool(
        Catalog(settings, resolver),
        admit,
        engine_starter(settings),
        limits,
        HubWork(timeout=settings.hf_metadata_timeout),
    )


def _hub_access(settings: Settings) -> HubAccess:
    token = settings.hf_token.get_secret_value() if settings.hf_token else None
    return HubAccess(
        settings.hf_endpoint,
        token,
        metadata_seconds=settings.hf_metadata_timeout,
        redirect_networks=tuple(parse_networks(settings.hf_redirect_networks)),
    )


def _puller(settings: Settings) -> Puller | None:
    if settings.hf_offline or not settings.allow_pull:
        return None
    return Puller(_hub_access(settings), settings.hf_cache_dir)


def _pull_refusal(settings: Settings) -> str:
    if settings.hf_offline:
        return "this server is offline (--hf-offline): it downloads nothing"
    return "this server does not download models: start it with --allow-pull"


class InferenceServer:
    """One server instance; tests run it in-process on port 0."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.pool = build_pool(settings)
        self.pool.on_engine_exit = self._engine_exited
        self.pool.on_loaded = self._model_loaded
        self.health = BoundedHealthServicer(
            settings.max_health_watches, settings.max_health_watches_per_connection
        )
        self._server = grpc.aio.server(options=server_options(settings))
        self._health_server: grpc.aio.Server | None = None
        self._warm_task: asyncio.Task[None] | None = None
        self._stopping = False
        self._health_updates: set[asyncio.Task[None]] = set()
        self.metrics_port: int | None = None
        self.health_port: int | None = None
        self.http_port: int | None = None
        commands = CommandResolver(settings.image_command, settings.image_command_managed)
        limits = ImageLimits(
            settings.image_max_width, settings.image_max_height, settings.image_max_steps
        )
        self.gate = ConcurrencyGate(
            settings.max_concurrent,
            settings.max_queue,
            settings.max_concurrent_per_model,
            settings.max_queue_per_model,
        )
        self.metrics = Metrics(self.pool, self.gate)
        self._offload = Offload()
        token = settings.auth_token
        servicer = InferenceServicer(
            self.pool,
            TextGenerator(self.pool),
            ImageGenerator(self.pool, settings, commands),
            limits,
            gate=self.gate,
            request_limits=RequestLimits.from_settings(settings),
            default_image_model=settings.default_image_model,
            metrics=self.metrics,
            auth=BearerAuth(token.get_secret_value()) if token else None,
            generation_limits=GenerationLimits(max_top_logprobs=settings.max_top_logprobs),
            offload=self._offload,
            pulls=Pulls(
                self.pool,
                _puller(settings),
                _pull_refusal(settings),
                on_demand=settings.pull_on_demand,
                cache_dir=settings.hf_cache_dir,
                may_delete=settings.allow_pull,
            ),
            stream_buffer_bytes=int(settings.stream_buffer_bytes),
            send_stall_seconds=settings.send_stall_seconds,
            default_embedding_model=settings.default_embedding_model,
        )
        add_inference_service(servicer, self._server)
        self.http: OpenAiHttp | None = None
        self._accept_errors: AcceptErrorLog | None = None
        if settings.http_listen:
            generate, list_models = below_grpc(servicer)
            self.http = OpenAiHttp(
                generate,
                list_models,
                auth=servicer.auth,
                metrics=self.metrics,
                body_limits=BodyLimits(
                    max_bytes=int(settings.http_max_body_bytes),
                    seconds=settings.http_body_seconds,
                    memory_bytes=int(settings.http_body_memory_bytes),
                ),
                connection_limits=ConnectionLimits(
                    max_connections=settings.http_max_connections,
                    max_per_peer=settings.http_max_connections_per_peer,
                    max_head_bytes=int(settings.http_max_head_bytes),
                    idle_seconds=settings.http_idle_seconds,
                ),
                connection_cap=http_connection_cap(settings.fd_reserve),
                offload=self._offload,
                serving=self.health.serving,
                send_stall_seconds=settings.send_stall_seconds,
                tokenizer=tokenizer_below_grpc(servicer),
                embed=embed_below_grpc(servicer),
                cors_origins=cors_origins(settings.http_cors_origins),
                max_choices=self.gate.per_model_active + self.gate.per_model_waiting,
            )
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        reflection.enable_server_reflection(SERVICE_NAMES, self._server)

    async def start(self) -> int:
        """Bind and start serving; returns the bound port."""
        credentials = server_credentials(self.settings)
        if credentials is None:
            port = self._server.add_insecure_port(self.settings.listen)
        else:
            port = self._server.add_secure_port(self.settings.listen, credentials)
        if port == 0:
            raise SystemExit(f"cannot listen on {self.settings.listen}")
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        # Accept errors at the descriptor limit: one line a minute, with a count.
        self._accept_errors = AcceptErrorLog(asyncio.get_running_loop())
        await self._server.start()
        if self.settings.health_listen:
            self.health_port = await self._serve_health(self.settings.health_listen)
        if self.settings.metrics_listen:
            self.metrics_port = self.metrics.serve(self.settings.metrics_listen)
            log.info("metrics", address=self.settings.metrics_listen, port=self.metrics_port)
        if self.http is not None and self.settings.http_listen:
            host, _, port_text = self.settings.http_listen.rpartition(":")
            self.http_port = await self.http.start(
                host.strip("[]"), int(port_text), http_tls(self.settings)
            )
            log.info("http", address=self.settings.http_listen, port=self.http_port)
        self.pool.start_housekeeping()
        self._warm_task = asyncio.create_task(self._warm_default_model())
        return port

    async def ready(self) -> None:
        """Wait until the default model is loaded (or failed to load)."""
        if self._warm_task is not None:
            await self._warm_task

    async def stop(self, grace: float | None = None) -> None:
        """Refuse new RPCs, let in-flight ones finish within `grace`, free models."""
        self._stopping = True
        await self.health.enter_graceful_shutdown()
        if self._warm_task is not None:
            self._warm_task.cancel()
        seconds = self.settings.grace_period if grace is None else grace
        # Both ports drain at once: new requests refused, those in flight given `seconds`.
        draining = [self._server.stop(seconds)]
        if self.http is not None:
            draining.append(self.http.drain(seconds))
        await asyncio.gather(*draining)
        if self._health_server is not None:
            await self._health_server.stop(0)
        self.metrics.stop()
        self._offload.close()
        if self._accept_errors is not None:
            self._accept_errors.close()
        await self.pool.close()

    async def _serve_health(self, listen: str) -> int:
        """grpc.health.v1 alone on a plaintext port, sharing the main port's statuses."""
        self._health_server = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._health_server)
        port = self._health_server.add_insecure_port(listen)
        if port == 0:
            raise SystemExit(f"cannot listen on {listen}")
        await self._health_server.start()
        log.info("health", address=listen, port=port)
        return port

    async def _warm_default_model(self) -> None:
        name = self.settings.default_model
        try:
            await self.pool.get(name)
        except Exception:
            log.exception("default model failed to load; health is NOT_SERVING", model=name)
            await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
            return
        await self._set_health(health_pb2.HealthCheckResponse.SERVING)
        log.info("default model loaded", model=name)

    def _model_loaded(self, model: str) -> None:
        """A model loaded: it serves (health service `model/NAME`); the default model
        (at start, after a crash, or by a request after a failed reload): the server
        serves."""
        self._in_background(self.health.set(model_service(model), SERVING))
        if model == self.settings.default_model and not self._stopping:
            self._in_background(self._set_health(SERVING))

    def _in_background(self, update: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(update)
        self._health_updates.add(task)
        task.add_done_callback(self._health_updates.discard)

    def _engine_exited(self, model: str) -> None:
        """An engine died (or was killed, hung): its model cannot serve until it loads
        again (`model/NAME` is NOT_SERVING). The server's health stays SERVING, unless it
        was the default model's and it cannot be loaded again: reload that one now
        rather than at the next request."""
        self._in_background(self.health.set(model_service(model), NOT_SERVING))
        if model == self.settings.default_model and not self._stopping:
            self._warm_task = asyncio.create_task(self._warm_default_model())

    async def _set_health(self, status: health_pb2.HealthCheckResponse.ServingStatus) -> None:
        for service in ("", INFERENCE_SERVICE):
            await self.health.set(service, status)


def bound_addresses(settings: Settings, server: InferenceServer, port: int) -> dict[str, str]:
    """Each listener's HOST:PORT with the port it really bound (port 0 resolved)."""
    listeners = {
        "grpc": (settings.listen, port),
        "http": (settings.http_listen, server.http_port),
        "health": (settings.health_listen, server.health_port),
        "metrics": (settings.metrics_listen, server.metrics_port),
    }
    return {
        name: f"{listen.rpartition(':')[0]}:{bound}"
        for name, (listen, bound) in listeners.items()
        if listen and bound
    }


def write_address_file(path: Path, addresses: dict[str, str]) -> None:
    """Whole or not at all: a reader polling for the file never sees half of it."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(addresses))
    partial.replace(path)


def model_service(model: str) -> str:
    """The health service name that says whether one model can serve."""
    return f"model/{model}"


async def serve(settings: Settings) -> None:
    server = InferenceServer(settings)
    addresses = bound_addresses(settings, server, await server.start())
    log.info("serving", address=addresses["grpc"], default_model=settings.default_model)
    if settings.address_file is not None:
        write_address_file(settings.address_file, addresses)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    await stopping.wait()
    log.info("draining", grace_period=settings.grace_period)
    await server.stop()
    log.info("stopped")


def main(argv: Sequence[str] | None = None) -> None:
    settings = load_settings(argv)
    configure_logging(settings)
    # A TMPDIR that cannot be used exits here; none at all is said, and text serves.
    no_temporary_directory = check_temporary_directory()
    if no_temporary_directory is not None:
        log.warning(
            "serving text and embeddings without a temporary directory; the external "
            "image command needs one",
            problem=no_temporary_directory,
        )
    asyncio.run(serve(settings))


if __name__ == "__main__":
    main()
