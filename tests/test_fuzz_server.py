"""Generated hostile grammars, JSON schemas and GGUF headers, thrown at a real server process.

The server runs in a child process, so a native crash shows as a dead process
and a failed test rather than a dead pytest. Every call must come back with a
status a client can act on (never INTERNAL or UNKNOWN) and a short message, the
process must outlive every case, and a plain request must still be served at
the end. The cases are seeded, so a failure repeats.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import pytest

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from service.models.embedded import EMBEDDED_MODELS
from tests.gguf_mutations import Mutation, Template, generate, issue_cases, written
from tests.hostile_grammars import hostile_cases
from tests.server_process import ServerProcess, server_process, wait_until_serving

SEED = 15
GRAMMAR_CASES = 150
GGUF_CASES = 40
# What a caller can act on; INTERNAL and UNKNOWN mean the server did not understand
# what went wrong.
CLEAR = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.PERMISSION_DENIED,
}
MAX_MESSAGE_CHARS = 2048


@dataclass
class Fuzzed:
    server: ServerProcess
    stub: pb_grpc.InferenceStub
    models: list[tuple[Mutation, Path]]


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzzed]:
    directory = tmp_path_factory.mktemp("mutated-models")
    template = Template.parse(EMBEDDED_MODELS["smollm2-135m-instruct"].locate())
    mutations = issue_cases() + generate(template, seed=SEED, count=GGUF_CASES)
    models = list(written(mutations, template, directory))  # sparse: headers only on disk
    arguments = ["--models-dir", str(directory), "--threads", "2", "--context-size", "256"]
    with (
        server_process([*arguments, "--max-loaded-models", "2"]) as server,
        grpc.insecure_channel(server.wait_for_address()) as channel,
    ):
        wait_until_serving(channel)
        yield Fuzzed(server, pb_grpc.InferenceStub(channel), models)


def _outcome(call: Callable[[], Any]) -> tuple[grpc.StatusCode, str]:
    """The status and message of a unary call or a stream read to its end."""
    try:
        result = call()
        if not isinstance(result, pb.AdmitResponse):
            list(result)
    except grpc.RpcError as error:
        return error.code(), error.details() or ""
    return grpc.StatusCode.OK, ""


def _check(fuzzed: Fuzzed, what: str, status: grpc.StatusCode, message: str) -> None:
    tail = "".join(fuzzed.server.log[-5:])
    assert fuzzed.server.process.poll() is None, f"{what}: the server died\n{tail}"
    assert status in CLEAR, f"{what}: {status.name} {message!r}"
    assert len(message) <= MAX_MESSAGE_CHARS, f"{what}: a {len(message)}-character message"


def _still_serving(fuzzed: Fuzzed) -> None:
    request = pb.GenerateRequest(prompt="Hello", max_tokens=2, temperature=0)
    events = list(fuzzed.stub.Generate(request, timeout=60))
    assert events[-1].finished.usage.completion_tokens == 2


def test_hostile_grammars_and_schemas_get_clear_answers(fuzzed: Fuzzed) -> None:
    refused = 0
    for case in hostile_cases(seed=SEED, count=GRAMMAR_CASES):
        try:
            request = pb.GenerateRequest(
                prompt="Hi", max_tokens=2, temperature=0, **case.request_fields()
            )
        except ValueError:  # a lone surrogate: no client can send it (undecodable bytes
            continue  # are tested in test_hostile_requests)
        status, message = _outcome(partial(fuzzed.stub.Generate, request, timeout=60))
        _check(fuzzed, case.name, status, message)
        refused += status == grpc.StatusCode.INVALID_ARGUMENT
    assert refused  # the cases include the issue's own crashers, which must be refused
    _still_serving(fuzzed)


def test_mutated_gguf_headers_get_clear_answers(fuzzed: Fuzzed) -> None:
    admitted = 0
    for mutation, path in fuzzed.models:
        name = path.name
        status, message = _outcome(partial(fuzzed.stub.Admit, pb.AdmitRequest(model=name)))
        _check(fuzzed, f"Admit {mutation.name}", status, message)
        request = pb.GenerateRequest(model=name, prompt="Hi", max_tokens=2, temperature=0)
        status, message = _outcome(partial(fuzzed.stub.Generate, request, timeout=120))
        _check(fuzzed, f"Generate {mutation.name}", status, message)
        admitted += status == grpc.StatusCode.OK
    assert admitted < len(fuzzed.models)  # the issue's broken files are among them
    _still_serving(fuzzed)
