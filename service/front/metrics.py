"""Prometheus metrics, served over HTTP beside the gRPC port (`--metrics-listen`).

Each server has its own registry, so several servers in one process (tests)
never share counters. Pool figures (loaded models, memory, loads and their
time, evictions) and the overload gate's figures (running, waiting) are read
when scraped rather than mirrored on every change.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterator

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector

from inference.v1 import inference_pb2 as pb
from service.front.metrics_http import ServedRegistry
from service.front.overload import ConcurrencyGate
from service.images.requests import ImageDone
from service.models.pool import LoadedModel, ModelPool

_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class Metrics(ServedRegistry):
    def __init__(self, pool: ModelPool, gate: ConcurrencyGate) -> None:
        super().__init__()
        self.rpcs = Counter(
            "inference_rpcs", "RPCs finished, by method, model and status code.",
            ["rpc", "model", "code"], registry=self.registry,
        )  # fmt: skip
        self.rpc_seconds = Histogram(
            "inference_rpc_duration_seconds", "Time from an RPC's start to its end.", ["rpc"],
            buckets=_LATENCY_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.in_flight = Gauge(
            "inference_rpcs_in_flight", "RPCs being served now.", ["rpc"], registry=self.registry
        )
        self.stalled = Counter(
            "inference_streams_stalled",
            "Streams given up because their client took nothing for --send-stall-seconds, "
            "by method (gRPC and HTTP alike).", ["rpc"], registry=self.registry,
        )  # fmt: skip
        self.ttft = Histogram(
            "inference_time_to_first_token_seconds",
            "From a Generate request reaching the server to its first token.", ["model"],
            buckets=_LATENCY_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.token_seconds = Histogram(
            "inference_time_per_output_token_seconds",
            "Mean time between output tokens after the first, one sample per Generate.",
            ["model"], buckets=_TOKEN_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.tokens = Counter(
            "inference_tokens", "Tokens by model and kind: prompt, cached_prompt, completion, and "
            "sampled_in_graph (completion tokens drawn inside llama.cpp's graph).",
            ["model", "kind"], registry=self.registry,
        )  # fmt: skip
        self.images = Counter(
            "inference_images", "Images generated, by model and backend.", ["model", "backend"],
            registry=self.registry,
        )  # fmt: skip
        self._pool = pool
        self.registry.register(_PoolCollector(pool))
        self.registry.register(_GateCollector(gate))

    def rpc_started(self, rpc: str) -> None:
        self.in_flight.labels(rpc).inc()

    def rpc_finished(self, rpc: str, model: str, code: str, seconds: float) -> None:
        self.in_flight.labels(rpc).dec()
        self.rpcs.labels(rpc, self._known(model), code).inc()
        self.rpc_seconds.labels(rpc).observe(seconds)

    def stream_stalled(self, rpc: str) -> None:
        self.stalled.labels(rpc).inc()

    def _known(self, model: str) -> str:
        """`model` if the server knows it, else "": a label for every name a client
        makes up would grow the metrics without bound."""
        pool = self._pool
        if model in pool.catalog.names() or any(m.name == model for m in pool.loaded()):
            return model
        return ""

    def generation(self, finished: pb.GenerationFinished, model: str) -> None:
        usage = finished.usage
        timing = finished.timing
        self.ttft.labels(model).observe(timing.ttft_ms / 1000)
        if usage.completion_tokens > 1:
            after_first = (timing.total_ms - timing.ttft_ms) / 1000
            self.token_seconds.labels(model).observe(after_first / (usage.completion_tokens - 1))
        self.tokens.labels(model, "prompt").inc(usage.prompt_tokens)
        self.tokens.labels(model, "cached_prompt").inc(usage.cached_prompt_tokens)
        self.tokens.labels(model, "completion").inc(usage.completion_tokens)
        self.tokens.labels(model, "sampled_in_graph").inc(usage.sampled_in_graph_tokens)

    def image(self, done: ImageDone) -> None:
        self.images.labels(done.model, done.backend).inc()


class _PoolCollector(Collector):
    def __init__(self, pool: ModelPool) -> None:
        self._pool = pool

    def collect(self) -> Iterator[Metric]:
        pool = self._pool
        loaded = GaugeMetricFamily(
            "inference_model_memory_bytes",
            "Estimated memory of each loaded model.",
            labels=["model", "backend"],
        )
        models = pool.loaded()
        for model in models:
            loaded.add_metric([model.name, model.backend_name], model.memory_bytes)
        yield loaded
        yield GaugeMetricFamily("inference_models_loaded", "Models loaded now.", len(models))
        yield GaugeMetricFamily(
            "inference_pool_used_bytes",
            "Memory of the budget in use: loaded models, loads in progress, models closing.",
            pool.used_bytes(),
        )
        yield GaugeMetricFamily(
            "inference_pool_budget_bytes", "The pool's memory budget.", pool.limits.budget_bytes
        )
        yield _counter("inference_model_loads", "Model loads, by model.", Tally(pool.stats.loads))
        load_time = SummaryMetricFamily(
            "inference_model_load_seconds", "Time spent loading each model.", labels=["model"]
        )
        for name, seconds in sorted(pool.stats.load_seconds.items()):
            load_time.add_metric([name], pool.stats.loads.get(name, 0), seconds)
        yield load_time
        yield _counter(
            "inference_model_evictions", "Models unloaded to make room or after idling.",
            _snapshot(pool.stats.evictions),
        )  # fmt: skip
        yield _counter(
            "inference_engine_crashes", "Engine processes that died unasked, by model.",
            _snapshot(pool.stats.crashes),
        )  # fmt: skip
        yield from _engine_memory(models)


def _engine_memory(models: list[LoadedModel]) -> Iterator[Metric]:
    """What each model's engine process holds, measured (in-process engines: none)."""
    rss = GaugeMetricFamily(
        "inference_engine_rss_bytes", "Resident memory of each model's engine process.",
        labels=["model"],
    )  # fmt: skip
    gpu = GaugeMetricFamily(
        "inference_engine_gpu_memory_bytes", "GPU memory of each model's engine process.",
        labels=["model"],
    )  # fmt: skip
    for model in models:
        measured = model.engine.memory()
        if measured is not None:
            rss.add_metric([model.name], measured.rss_bytes)
            gpu.add_metric([model.name], measured.gpu_bytes)
    yield rss
    yield gpu


class _GateCollector(Collector):
    def __init__(self, gate: ConcurrencyGate) -> None:
        self._gate = gate

    def collect(self) -> Iterator[Metric]:
        gate = self._gate
        yield GaugeMetricFamily(
            "inference_requests_running", "Requests holding a model-work slot.", gate.active
        )
        yield GaugeMetricFamily(
            "inference_queue_depth", "Requests waiting for a model-work slot.", gate.waiting
        )
        yield GaugeMetricFamily(
            "inference_max_concurrent", "Model-work slots (--max-concurrent).", gate.max_active
        )
        yield GaugeMetricFamily(
            "inference_max_queue", "Waiting room (--max-queue).", gate.max_waiting
        )


def _snapshot(counts: Tally[str]) -> Tally[str]:
    """A copy taken in one step (dict.copy holds the GIL), so the event loop counting
    meanwhile cannot break this thread's iteration."""
    return Tally(dict.copy(counts))


def _counter(name: str, documentation: str, counts: Tally[str]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, documentation, labels=["model"])
    for model, count in sorted(counts.items()):
        family.add_metric([model], count)
    return family
