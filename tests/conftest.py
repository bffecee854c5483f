"""A real server on a real port, called through the generated stubs."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from service.config import Settings
from service.front.server import InferenceServer
from service.log import configure_logging
from tests import tiers
from tests.tiny_model import tiny_gguf

T = TypeVar("T")

SMOLLM = "smollm2-135m-instruct"
GEMMA = "gemma3-270m"


class RunningServer:
    """An InferenceServer on port 0, its event loop on a background thread."""

    def __init__(self, settings: Settings) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        try:
            self.server = self.run(self._build(settings))
            self.port = self.run(self.server.start())
            self.run(self.server.ready())
        except BaseException:
            self._end_loop()  # a server that did not start leaves no loop to the collector
            raise
        self.target = f"127.0.0.1:{self.port}"

    @staticmethod
    async def _build(settings: Settings) -> InferenceServer:
        return InferenceServer(settings)  # grpc.aio objects belong to the running loop

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float = 120) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    def stop(self) -> None:
        try:
            self.run(self.server.stop(grace=0))
        finally:
            self._end_loop()

    def _end_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self._loop.close()


def make_settings(**overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "listen": "127.0.0.1:0",
        # One decode thread per engine: on two cores shared with this process, the front
        # and other work, ggml's two threads spin at every barrier whenever one of them is
        # descheduled, and a stream slows four to eight times (measured); one never waits.
        "threads": 1,
        "context_size": 1024,
        "default_model": SMOLLM,
        "log_format": "json",
        "log_level": "warning",
    }
    values.update(overrides)
    return Settings(**values)


def eventually(condition: Callable[[], bool]) -> bool:
    """Whether `condition` holds within a minute: a bound on a hang, not on speed."""
    deadline = time.monotonic() + 60
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return condition()


@contextmanager
def serving(settings: Settings) -> Iterator[tuple[RunningServer, pb_grpc.InferenceStub]]:
    """A server of its own for a test or module, and a stub connected to it."""
    running = RunningServer(settings)
    try:
        with grpc.insecure_channel(running.target) as channel:
            yield running, pb_grpc.InferenceStub(channel)
    finally:
        running.stop()


def pytest_configure(config: pytest.Config) -> None:
    tiers.register(config)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    tiers.mark(items)  # markers from what each test uses: see tests/tiers.py


@pytest.fixture(scope="session", autouse=True)
def _logging() -> None:
    configure_logging(make_settings())  # as main() does: log lines to stderr, never stdout


@pytest.fixture(scope="session")
def server() -> Iterator[RunningServer]:
    running = RunningServer(make_settings())
    yield running
    running.stop()


@pytest.fixture(scope="session")
def tiny_model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random GGUF with SmolLM2's vocabulary (tests/tiny_model.py), for tests where
    the model's words do not matter; kept in pytest's cache between runs."""
    cache = getattr(request.config, "cache", None)
    folder = cache.mkdir("tiny-model") if cache is not None else tmp_path_factory.mktemp("tiny")
    return tiny_gguf(Path(folder))


@pytest.fixture(scope="session")
def channel(server: RunningServer) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.target) as channel:
        yield channel


@pytest.fixture(scope="session")
def stub(channel: grpc.Channel) -> pb_grpc.InferenceStub:
    return pb_grpc.InferenceStub(channel)


def collect(stream: Any) -> list[pb.GenerateResponse]:
    return list(stream)


def text_of(events: list[pb.GenerateResponse]) -> str:
    return "".join(e.delta.text for e in events if e.WhichOneof("event") == "delta")


def finished_of(events: list[pb.GenerateResponse]) -> pb.GenerationFinished:
    assert events[-1].WhichOneof("event") == "finished"
    return events[-1].finished
