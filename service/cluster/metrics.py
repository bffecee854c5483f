"""The endpoint picker's Prometheus metrics, served over HTTP (`--metrics-listen`).

As the server's (service/front/metrics.py): names start `inference_picker_`, and each
picker has its own registry, so several pickers in one process (tests) never
share counters. Counters and histograms are prometheus_client's own, updated on
the event loop as decisions and polls happen (they take their own locks). What
describes the replicas is read when scraped from the monitor's `view`: a tuple
of frozen records the event loop replaces whole after each refresh, never a
dict the loop is changing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from service.cluster.ranking import REASONS, Reason
from service.cluster.replicas import ReplicaView
from service.front.metrics_http import ServedRegistry

# Ranking one request takes about 0.1 ms; reading and hashing a long prompt more.
_DECISION_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1)
# A poll is two RPCs on loopback or in the cluster; --poll-timeout (1 s) bounds each.
_POLL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class PickerMetrics(ServedRegistry):
    def __init__(
        self,
        view: Callable[[], Sequence[ReplicaView]],
        *,
        methods: Sequence[str],
        prefix_capacity: int,
    ) -> None:
        super().__init__()
        self.decisions = Counter(
            "inference_picker_decisions",
            "Requests the picker routed, by method and by why the first replica it named "
            "was first (reason).",
            ["method", "reason"], registry=self.registry,
        )  # fmt: skip
        self.decision_seconds = Histogram(
            "inference_picker_decision_duration_seconds",
            "From a request's body reaching the picker to its answer: reading the body, "
            "hashing the prompt, ranking the replicas.",
            buckets=_DECISION_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.unread = Counter(
            "inference_picker_unread_bodies",
            "Routed requests whose body could not be read (compressed, not the message "
            "it claims, not JSON the replica would take, or none): ranked without model "
            "or prompt.",
            ["method"], registry=self.registry,
        )  # fmt: skip
        self.prompt_chars = Counter(
            "inference_picker_prompt_chars",
            "Characters of the Generate (and HTTP completions) prompts routed to a replica.",
            registry=self.registry,
        )
        self.prefix_chars = Counter(
            "inference_picker_prefix_hit_chars",
            "Of those, the leading characters the chosen replica had been sent before "
            "(probably in its prompt cache).",
            registry=self.registry,
        )
        self.polls = Histogram(
            "inference_picker_poll_duration_seconds",
            "Time of one poll of one replica (health and ListModels), by outcome: "
            "SERVING, another health status, or the gRPC status code of the failure.",
            ["outcome"], buckets=_POLL_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.prefix_blocks = Gauge(
            "inference_picker_prefix_blocks",
            "Prompt blocks the prefix table remembers now.",
            registry=self.registry,
        )
        capacity = Gauge(
            "inference_picker_prefix_capacity",
            "Prompt blocks the prefix table may remember (--prefix-capacity).",
            registry=self.registry,
        )
        capacity.set(prefix_capacity)
        for method in methods:  # every series from the start, at 0
            self.unread.labels(method)
            for reason in REASONS:
                self.decisions.labels(method, reason)
        self.registry.register(_ReplicaCollector(view))

    def decided(self, method: str, reason: Reason, seconds: float) -> None:
        self.decisions.labels(method, reason).inc()
        self.decision_seconds.observe(seconds)

    def polled(self, outcome: str, seconds: float) -> None:
        self.polls.labels(outcome).observe(seconds)


class _ReplicaCollector(Collector):
    def __init__(self, view: Callable[[], Sequence[ReplicaView]]) -> None:
        self._view = view

    def collect(self) -> Iterator[Metric]:
        replicas = self._view()  # one immutable tuple: read once, consistent
        up = GaugeMetricFamily(
            "inference_picker_replica_up",
            "1 if the replica answered its last poll SERVING (the picker routes to it), else 0.",
            labels=["replica"],
        )
        load = GaugeMetricFamily(
            "inference_picker_replica_load",
            "Requests running and queued on the replica, as its last answered poll said.",
            labels=["replica"],
        )
        for replica in replicas:
            up.add_metric([replica.address], 1 if replica.up else 0)
            load.add_metric([replica.address], replica.running + replica.waiting)
        yield up
        yield load
        yield GaugeMetricFamily(
            "inference_picker_replicas_up",
            "Replicas up: the picker routes to them.",
            sum(1 for replica in replicas if replica.up),
        )
        yield GaugeMetricFamily(
            "inference_picker_replicas",
            "Replicas known: named by --replica or found by --replicas-dns, up or not.",
            len(replicas),
        )
