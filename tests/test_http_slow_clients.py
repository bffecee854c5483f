"""HTTP clients that read slowly, or send slowly, cannot pin the server (issue 38).

The gRPC port's stream discipline (tests/test_slow_readers.py), over the
OpenAI-compatible HTTP port, with a raw socket for a client (tests/slow_http.py):
a generation runs ahead of its reader by a bounded buffer and lets go of its
slot when it ends; a response the socket cannot take for --send-stall-seconds is
given up, its connection dropped; a body that has not all come within
--http-body-seconds is answered 408 before it takes a slot.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest

from tests.conftest import SMOLLM, RunningServer, make_settings, serving
from tests.slow_http import SlowClient

CHAT = "/v1/chat/completions"
SLOTS = 6
# Two choices with twenty alternatives per token: over a kilobyte of JSON a token,
# so a client that reads nothing stops the server's writes within a few steps.
WORDY: dict[str, Any] = {
    "model": SMOLLM,
    "messages": [{"role": "user", "content": "Tell me a long story about a ship."}],
    "n": 2,
    "logprobs": True,
    "top_logprobs": 20,
    "temperature": 0,
    "max_tokens": 24,
}
STREAMED = {**WORDY, "stream": True}


def _settings(**overrides: Any) -> Any:
    return make_settings(
        http_listen="127.0.0.1:0",
        context_size=2048,  # room for every choice's tokens at once
        max_concurrent=SLOTS,
        max_concurrent_per_model=SLOTS,
        max_queue=0,
        **overrides,
    )


@pytest.fixture(scope="module")
def patient() -> Iterator[RunningServer]:
    """Waits for ever, near enough: what a slow client holds while it is slow."""
    with serving(_settings(send_stall_seconds=600, http_body_seconds=600)) as (running, _):
        yield running


@pytest.fixture(scope="module")
def strict() -> Iterator[RunningServer]:
    """Gives up soon; a buffer of one byte, so a generation pauses as soon as its
    reader falls behind, and holds its slot until the send stall gives up on it."""
    settings = _settings(send_stall_seconds=2, http_body_seconds=1, stream_buffer_bytes=1)
    with serving(settings) as (running, _):
        yield running


def _port(running: RunningServer) -> int:
    assert running.server.http is not None
    assert running.server.http.port is not None
    return running.server.http.port


def _sample(running: RunningServer, name: str, **labels: str) -> float:
    value = running.server.metrics.registry.get_sample_value(name, labels)
    return value or 0.0


def _in_flight(running: RunningServer) -> float:
    return _sample(running, "inference_rpcs_in_flight", rpc="ChatCompletions")


def _generations(running: RunningServer) -> float:
    """Generations that ran to their end (each choice is one)."""
    return _sample(running, "inference_time_to_first_token_seconds_count", model=SMOLLM)


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _cut_short(answer: bytes) -> bool:
    """Whether a whole answer came with fewer body bytes than its Content-Length."""
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode().lower().splitlines()
    length = next(int(line.split(":")[1]) for line in lines if line.startswith("content-length"))
    return len(body) < length


def _served_with_every_slot(running: RunningServer) -> None:
    """A request that needs every slot of the server at once is served."""
    client = openai.OpenAI(
        base_url=f"http://127.0.0.1:{_port(running)}/v1", api_key="none", max_retries=0
    )
    answer = client.chat.completions.create(
        model=SMOLLM, messages=WORDY["messages"], n=SLOTS, max_tokens=2
    )
    assert answer.usage is not None
    assert answer.usage.completion_tokens == 2 * SLOTS


def test_readers_that_stop_hold_no_slot_once_generated(patient: RunningServer) -> None:
    port, gate = _port(patient), patient.server.gate
    before = _generations(patient)
    with SlowClient(port) as deaf, SlowClient(port) as slow, SlowClient(port) as whole:
        deaf.post(CHAT, STREAMED)  # reads nothing
        slow.post(CHAT, STREAMED)
        slow.read_slowly(seconds_per_byte=1)
        whole.post(CHAT, WORDY)  # a whole answer, never read
        # Every choice's generation ends and lets go of its slot...
        _wait_for(lambda: _generations(patient) == before + 6, "the generations to end")
        _wait_for(lambda: gate.active == 0, "their slots to free")
        # ...while every response is still stuck in its send: nothing is read.
        assert _in_flight(patient) == 3
        # Meanwhile another client is served, with every slot of the server.
        _served_with_every_slot(patient)
        _wait_for(lambda: _in_flight(patient) == 3, "that request to end")  # these did not
        assert b"[DONE]" not in slow.received
    _wait_for(lambda: _in_flight(patient) == 0, "the closed connections' requests to end")


def test_readers_that_stop_are_cancelled_after_the_send_stall(strict: RunningServer) -> None:
    port, gate = _port(strict), strict.server.gate
    long_story = {**STREAMED, "max_tokens": 40}  # paused long before its end
    cancelled = {"rpc": "ChatCompletions", "model": SMOLLM, "code": "CANCELLED"}
    before = _generations(strict)
    with SlowClient(port) as deaf, SlowClient(port) as slow, SlowClient(port) as whole:
        deaf.post(CHAT, long_story)
        slow.post(CHAT, long_story)
        slow.read_slowly(seconds_per_byte=1)
        whole.post(CHAT, WORDY)
        _wait_for(lambda: _in_flight(strict) == 3, "the requests to start")
        # Each is given up once the socket has taken nothing for the send stall.
        _wait_for(lambda: _in_flight(strict) == 0, "the stalled responses to be given up")
        assert _sample(strict, "inference_streams_stalled_total", rpc="ChatCompletions") == 3
        assert _sample(strict, "inference_rpcs_total", **cancelled) == 3
        # The streams' generations were paused by their full buffers, and stopped
        # with them: only the whole answer's two choices ran to their end.
        assert _generations(strict) == before + 2
        assert gate.active == 0
        # Its connection was dropped: the client reads what the kernel held, then the end.
        assert b"[DONE]" not in deaf.read_to_end()
        assert deaf.ended in ("eof", "reset")
        assert _cut_short(whole.read_to_end())
    _served_with_every_slot(strict)


def test_slow_bodies_hold_no_slot(patient: RunningServer) -> None:
    port, gate = _port(patient), patient.server.gate
    with SlowClient(port) as silent, SlowClient(port) as trickling:
        silent.post_slowly(CHAT, WORDY, seconds_per_byte=0)  # headers, then nothing
        trickling.post_slowly(CHAT, WORDY, seconds_per_byte=0.5)
        _wait_for(lambda: _in_flight(patient) == 2, "the slow requests to begin")
        assert gate.active == 0
        _served_with_every_slot(patient)
        _wait_for(lambda: _in_flight(patient) == 2, "that request to end")  # these wait on
    _wait_for(lambda: _in_flight(patient) == 0, "the closed connections' requests to end")


def test_slow_bodies_are_answered_408_and_dropped(strict: RunningServer) -> None:
    port = _port(strict)
    timed_out = {"rpc": "ChatCompletions", "model": "", "code": "DEADLINE_EXCEEDED"}
    with SlowClient(port) as silent, SlowClient(port) as trickling:
        silent.post_slowly(CHAT, WORDY, seconds_per_byte=0)
        trickling.post_slowly(CHAT, WORDY, seconds_per_byte=0.2)
        for client in (silent, trickling):
            answer = client.read_to_end()  # the server ends the connection
            assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
            assert b"did not all arrive within 1 s" in answer
    assert _sample(strict, "inference_rpcs_total", **timed_out) == 2
    _served_with_every_slot(strict)
