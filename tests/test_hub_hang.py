"""A hub that never answers holds nothing but its own threads (issue 27).

Forty Admits of hub repos waiting on a hub that accepted their connections
and said nothing delayed a local model's load from 0.7 s to 61 s: hub calls
and loads shared asyncio's few default threads. Hub calls now have threads
of their own, a bound on how many wait, and a deadline.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator

import grpc
import pytest

from inference.v1 import inference_pb2 as pb
from service.hub.budget import CONCURRENT_READS
from tests.conftest import GEMMA, collect, finished_of, make_settings, serving

ADMITS = 40


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


class SilentHub:
    """An address that accepts connections and never sends a byte."""

    def __init__(self, url: str, held: list[socket.socket]) -> None:
        self.url = url
        self.held = held


@pytest.fixture
def silent_hub() -> Iterator[SilentHub]:
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield SilentHub(f"http://127.0.0.1:{listener.getsockname()[1]}", held)
    stop.set()
    thread.join()
    for connection in held:
        connection.close()
    listener.close()


def test_a_silent_hub_does_not_hold_up_a_local_load(silent_hub: SilentHub) -> None:
    settings = make_settings(
        hf_offline=False, hf_endpoint=silent_hub.url, hf_token=None, hf_metadata_timeout=60
    )
    with serving(settings) as (_, stub):
        admits = [
            stub.Admit.future(pb.AdmitRequest(model=f"acme/repo-{index}"))
            for index in range(ADMITS)
        ]
        # Wait until Admits are stuck at the hub (CONCURRENT_READS of them read at once,
        # the others wait for them on the hub's threads): before, they held asyncio's
        # default executor, which loads need, and starved them.
        _wait_for(lambda: len(silent_hub.held) >= CONCURRENT_READS, "Admits at the hub")
        # Gemma is not loaded yet: its load runs while the Admits wait on the hub.
        request = pb.GenerateRequest(model=GEMMA, prompt="Hello", max_tokens=2)
        assert finished_of(collect(stub.Generate(request))).usage.completion_tokens == 2
        # Still waiting on the hub (each read gives up after 10 s of silence, two at a
        # time, so half of them take 100 s to end).
        assert sum(not admit.done() for admit in admits) >= ADMITS // 2
        for admit in admits:
            admit.cancel()


def test_a_silent_hub_is_unavailable_after_the_deadline(silent_hub: SilentHub) -> None:
    settings = make_settings(
        hf_offline=False, hf_endpoint=silent_hub.url, hf_token=None, hf_metadata_timeout=1
    )
    with serving(settings) as (_, stub), pytest.raises(grpc.RpcError) as caught:
        stub.Admit(pb.AdmitRequest(model="acme/repo"))
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "did not answer within 1 s" in str(caught.value.details())
