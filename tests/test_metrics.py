"""Prometheus metrics on their own port, counting what the server did."""

from __future__ import annotations

import urllib.request

import grpc
import pytest
from prometheus_client import Counter
from prometheus_client.parser import text_string_to_metric_families

from inference.v1 import inference_pb2 as pb
from service.front.metrics_http import ServedRegistry
from tests.conftest import SMOLLM, RunningServer, collect, make_settings, serving


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_metrics_count_rpcs_tokens_and_the_pool() -> None:
    with serving(make_settings(metrics_listen="127.0.0.1:0")) as (running, stub):
        port = running.server.metrics_port
        assert port
        before = scrape(port)
        request = pb.GenerateRequest(prompt="Hello", max_tokens=3, temperature=0)
        collect(stub.Generate(request))
        with pytest.raises(grpc.RpcError):
            collect(stub.Generate(pb.GenerateRequest(prompt="Hello", top_p=5)))
        with pytest.raises(grpc.RpcError):  # a name made up by the client is no label
            collect(stub.Generate(pb.GenerateRequest(model="made-up-7", prompt="Hello")))
        metrics = scrape(port)
    model = (("model", SMOLLM),)
    ok = (("code", "OK"), *model, ("rpc", "Generate"))
    assert ("inference_rpcs_total", ok) not in before
    assert metrics[("inference_rpcs_total", ok)] == 1
    invalid = (("code", "INVALID_ARGUMENT"), ("model", ""), ("rpc", "Generate"))
    assert metrics[("inference_rpcs_total", invalid)] == 1
    unknown = (("code", "NOT_FOUND"), ("model", ""), ("rpc", "Generate"))
    assert metrics[("inference_rpcs_total", unknown)] == 1
    assert not any(("model", "made-up-7") in labels for _, labels in metrics)
    assert metrics[("inference_tokens_total", (("kind", "completion"), *model))] == 3
    assert metrics[("inference_time_per_output_token_seconds_count", model)] == 1
    assert 0 < metrics[("inference_time_per_output_token_seconds_sum", model)] < 5
    assert metrics[("inference_tokens_total", (("kind", "prompt"), *model))] > 0
    assert metrics[("inference_time_to_first_token_seconds_count", model)] == 1
    assert metrics[("inference_rpcs_in_flight", (("rpc", "Generate"),))] == 0
    assert metrics[("inference_model_loads_total", model)] == 1
    assert metrics[("inference_model_load_seconds_count", model)] == 1
    assert metrics[("inference_model_load_seconds_sum", model)] > 0
    assert metrics[("inference_models_loaded", ())] == 1
    assert metrics[("inference_queue_depth", ())] == 0
    assert metrics[("inference_requests_running", ())] == 0
    memory = metrics[("inference_model_memory_bytes", (("backend", "llama.cpp"), *model))]
    assert memory == metrics[("inference_pool_used_bytes", ())] > 0
    assert metrics[("inference_pool_budget_bytes", ())] >= memory


def test_metrics_are_off_unless_asked_for(server: RunningServer) -> None:
    assert server.server.metrics_port is None  # the session's server: no --metrics-listen


def test_metrics_serve_on_an_ipv6_address_written_in_brackets() -> None:
    """As --listen is written; the server's own port used to refuse it."""
    served = ServedRegistry()
    Counter("probe", "A counter to find.", registry=served.registry).inc(3)
    port = served.serve("[::1]:0")
    try:
        with urllib.request.urlopen(f"http://[::1]:{port}/metrics", timeout=10) as response:
            text = response.read().decode()
    finally:
        served.stop()
    assert "probe_total 3.0" in text
