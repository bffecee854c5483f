"""The servers bench.serving sends to, each timed the same way from the client's side.

A `Target` streams one request and returns what a client saw: when the first
token came, when each later one came, how many there were. The service is
called over gRPC (grpc.aio, one channel), llama.cpp's own server over its
HTTP API (`/completion`, streamed as server-sent events) with an asyncio
HTTP client, so the load generator costs the same for both.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

import grpc
import httpx2

from bench.workload import Request
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc


@dataclass
class Outcome:
    """One request as its client saw it (times from time.perf_counter)."""

    sent: float
    prompt_tokens: int
    first: float = 0.0
    token_times: list[float] = field(default_factory=list)  # a time per token after the first
    output_tokens: int = 0
    error: str = ""

    @property
    def ttft(self) -> float:
        return self.first - self.sent

    @property
    def ended(self) -> float:
        return self.token_times[-1] if self.token_times else self.first


class Target(Protocol):
    name: str

    async def send(self, request: Request) -> Outcome: ...

    async def close(self) -> None: ...


class ServiceTarget:
    """The service over gRPC; greedy unless `sampling` names other fields."""

    def __init__(self, address: str, sampling: dict[str, float] | None = None) -> None:
        self.name = "service"
        self._channel = grpc.aio.insecure_channel(address)
        self._stub = pb_grpc.InferenceStub(self._channel)
        self._sampling = sampling or {"temperature": 0.0}

    async def send(self, request: Request) -> Outcome:
        message = pb.GenerateRequest(prompt=request.prompt, max_tokens=request.max_tokens)
        for name, value in self._sampling.items():
            setattr(message, name, value)
        outcome = Outcome(time.perf_counter(), request.prompt_tokens)
        try:
            async for event in self._stub.Generate(message):
                if event.WhichOneof("event") == "delta":
                    _arrived(outcome, len(event.delta.token_ids))
        except grpc.aio.AioRpcError as error:
            outcome.error = f"{error.code().name}: {error.details()}"
        return outcome

    async def close(self) -> None:
        await self._channel.close(None)


class LlamaServerTarget:
    """llama.cpp's server: the same prompt text and token budget, streamed."""

    def __init__(self, url: str, sampling: dict[str, float] | None = None) -> None:
        self.name = "llama-server"
        self._url = f"{url}/completion"
        self._client = httpx2.AsyncClient(timeout=None)
        self._sampling = sampling or {"temperature": 0.0}

    async def send(self, request: Request) -> Outcome:
        body = {
            "prompt": request.prompt,
            "n_predict": request.max_tokens,
            "stream": True,
            **self._sampling,
        }
        outcome = Outcome(time.perf_counter(), request.prompt_tokens)
        try:
            async with self._client.stream("POST", self._url, json=body) as answer:
                answer.raise_for_status()
                async for line in _sse_lines(answer.aiter_bytes()):
                    self._read(outcome, line)
        except httpx2.HTTPError as error:
            outcome.error = f"{type(error).__name__}: {error}"
        return outcome

    @staticmethod
    def _read(outcome: Outcome, line: bytes) -> None:
        if not line.startswith(b"data: "):
            return
        chunk = json.loads(line[6:])
        if chunk.get("stop"):  # the summary: no token of its own
            return
        _arrived(outcome, 1)

    async def close(self) -> None:
        await self._client.aclose()


async def _sse_lines(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The lines of a server-sent event stream, split at newlines only.

    A generated token can be U+2028 or another character that `str.splitlines`
    (and so an HTTP client's line iterator) also breaks at, and llama-server
    writes such characters unescaped inside its JSON strings."""
    pending = b""
    async for chunk in chunks:
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            yield line.rstrip(b"\r")
    if pending:
        yield pending


def _arrived(outcome: Outcome, tokens: int) -> None:
    """`tokens` tokens arrived now. A message of several (text held back until it is
    whole) spreads its gap over them, so the inter-token latency is the gap per token,
    as for a server that sends one token a message."""
    now = time.perf_counter()
    if tokens <= 0:
        return
    if not outcome.first:
        outcome.first = now
        outcome.output_tokens = tokens
        outcome.token_times += [now] * (tokens - 1)
        return
    last = outcome.ended
    outcome.token_times += [last + (now - last) * i / tokens for i in range(1, tokens + 1)]
    outcome.output_tokens += tokens
