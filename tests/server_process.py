"""`inference-server` in a child process, for tests that need the real process:
signals, exit codes, the log it writes, or surviving what would crash it."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


@dataclass
class ServerProcess:
    process: subprocess.Popen[str]
    log: list[str] = field(default_factory=list)
    address: str = ""
    http_port: int = 0

    def read_log(self) -> None:
        """Collect stderr; note the address once the server says it is serving."""
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.log.append(line)
            if '"serving"' in line:
                self.address = json.loads(line)["address"]
            elif '"event": "http"' in line:
                self.http_port = int(json.loads(line)["port"])

    def wait_for_address(self) -> str:
        deadline = time.monotonic() + 30
        while not self.address and time.monotonic() < deadline:
            assert self.process.poll() is None, f"the server exited: {self.log[-5:]}"
            time.sleep(0.02)
        assert self.address, f"the server never said it was serving: {self.log}"
        return self.address

    def logged(self, event: str) -> bool:
        return any(f'"event": "{event}"' in line for line in self.log)


@contextmanager
def server_process(
    arguments: Sequence[str] = (),
    env: dict[str, str] | None = None,
    descriptor_limit: int | None = None,
) -> Iterator[ServerProcess]:
    """`python -m service.front --listen 127.0.0.1:0 ARGUMENTS`, JSON logs; killed at the end.
    `descriptor_limit`: the child's RLIMIT_NOFILE, soft and hard."""
    command = [sys.executable, "-m", "service.front", "--listen", "127.0.0.1:0", *arguments]
    env = {**os.environ, "INFERENCE_LOG_FORMAT": "json", **(env or {})}

    def limited() -> None:
        if descriptor_limit is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (descriptor_limit, descriptor_limit))

    process = subprocess.Popen(
        command, stderr=subprocess.PIPE, text=True, env=env, preexec_fn=limited
    )
    server = ServerProcess(process)
    reader = threading.Thread(target=server.read_log, daemon=True)
    reader.start()
    try:
        yield server
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)
        reader.join(timeout=10)
        assert process.stderr is not None
        process.stderr.close()


def wait_until_serving(channel: grpc.Channel) -> None:
    stub = health_pb2_grpc.HealthStub(channel)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
        if reply.status == health_pb2.HealthCheckResponse.SERVING:
            return
        time.sleep(0.05)
    raise AssertionError("the server never reported SERVING")
