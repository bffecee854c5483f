"""A grammar that passes every static check can still go wrong while sampling: it can
rule out every token of the vocabulary (llama.cpp then aborts the process), or grow
costlier with each token (stalling every stream of the model). Such a sequence alone
ends with INVALID_ARGUMENT; the server and the model's other streams go on."""

from __future__ import annotations

import json
from collections.abc import Iterator

import grpc
import pytest

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from service.backends.llama_cpp import sampling as llama_sampling
from tests.conftest import GEMMA, SMOLLM, collect, finished_of, make_settings, serving
from tests.server_process import server_process, wait_until_serving


@pytest.fixture(scope="module")
def process_stub() -> Iterator[pb_grpc.InferenceStub]:
    """A server in a child process: the old code aborted it, which must not end pytest."""
    with (
        server_process(["--threads", "2"]) as server,
        grpc.insecure_channel(server.wait_for_address()) as channel,
    ):
        wait_until_serving(channel)
        yield pb_grpc.InferenceStub(channel)
        assert server.process.poll() is None


@pytest.mark.parametrize(
    "grammar",
    [
        "root ::= <[2]>",  # SmolLM2's <|im_end|>: an end-of-generation token
        'root ::= "a" <|im_end|>',  # the same, by its text, after one token
    ],
)
def test_a_grammar_no_token_can_satisfy_ends_its_request_only(
    process_stub: pb_grpc.InferenceStub, grammar: str
) -> None:
    request = pb.GenerateRequest(prompt="Hi", max_tokens=8, temperature=0, grammar=grammar)
    with pytest.raises(grpc.RpcError) as caught:
        collect(process_stub.Generate(request, timeout=60))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "allows no token of this model's vocabulary" in (caught.value.details() or "")
    plain = pb.GenerateRequest(prompt="Hello", max_tokens=2, temperature=0)
    assert finished_of(collect(process_stub.Generate(plain, timeout=60))).usage.completion_tokens


# Each "x" doubles the ways the text can go on ("x" s "a" or "x" s "b"), and with them
# llama.cpp's work per token; the prompt makes the model keep writing "x".
AMBIGUOUS = 'root ::= s\ns ::= "x" s "a" | "x" s "b" | "y"'


def test_a_grammar_that_grows_too_costly_ends_while_others_stream(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A budget this small trips within a few tokens on any machine: the cost doubles.
    monkeypatch.setattr(llama_sampling, "GRAMMAR_STEP_SECONDS", 0.02)
    with serving(make_settings()) as (_, stub):
        other = stub.Generate(
            pb.GenerateRequest(prompt="Count: 1, 2,", max_tokens=40, temperature=0)
        )
        hostile = pb.GenerateRequest(
            prompt="x x x x x x x x x x x x", max_tokens=40, temperature=0, grammar=AMBIGUOUS
        )
        with pytest.raises(grpc.RpcError) as caught:
            collect(stub.Generate(hostile, timeout=120))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "too ambiguous" in (caught.value.details() or "")
        assert finished_of(collect(other)).usage.completion_tokens == 40


ENUM_OF_1000 = json.dumps({"enum": [f"name-{i:04d}" for i in range(1000)]})


def test_a_grammar_too_costly_for_the_models_vocabulary_is_refused_before_it_samples(
    stub: pb_grpc.InferenceStub,
) -> None:
    def generate(model: str) -> list[pb.GenerateResponse]:
        request = pb.GenerateRequest(
            model=model,
            prompt="Pick one:",
            max_tokens=8,
            temperature=0,
            response_format=pb.ResponseFormat(json_schema=ENUM_OF_1000),
        )
        return collect(stub.Generate(request, timeout=120))

    # 1,000 ways at the first character, each checked against every token sampled:
    # about 49 million checks on SmolLM2's 49k vocabulary, 262 million on Gemma's.
    assert finished_of(generate(SMOLLM)).usage.completion_tokens > 0
    with pytest.raises(grpc.RpcError) as caught:
        generate(GEMMA)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = caught.value.details() or ""
    assert "can branch 1000 ways at one point" in details
    assert "262144 tokens" in details
