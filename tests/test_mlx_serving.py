"""A safetensors checkpoint served end to end: admission, the registry, mlx-lm, gRPC."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from tests.conftest import collect, finished_of, make_settings, serving, text_of


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.mlx_checkpoint import build_tiny_checkpoint  # mlx: imported where needed

    return build_tiny_checkpoint(tmp_path_factory.mktemp("mlx-models") / "tiny")


@pytest.fixture(scope="module")
def stub(checkpoint: Path) -> Iterator[pb_grpc.InferenceStub]:
    with serving(make_settings(models_dir=[checkpoint.parent])) as (_, stub):
        yield stub


def test_admit_routes_a_checkpoint_to_mlx_lm(stub: pb_grpc.InferenceStub) -> None:
    reply = stub.Admit(pb.AdmitRequest(model="tiny"))
    assert reply.admitted, reply.reason
    assert (reply.backend, reply.architecture) == ("mlx-lm", "llama")
    assert reply.memory.weights_bytes > 0


def test_a_checkpoint_streams_through_the_shared_decode_loop(stub: pb_grpc.InferenceStub) -> None:
    request = pb.GenerateRequest(model="tiny", prompt="The quick brown fox", max_tokens=6)
    request.temperature = 0
    first = collect(stub.Generate(request))
    second = collect(stub.Generate(request))
    assert first[0].started.backend == "mlx-lm"
    assert finished_of(first).finish_reason == pb.FINISH_REASON_LENGTH
    assert finished_of(first).usage.completion_tokens == 6
    assert text_of(first) == text_of(second)
    assert finished_of(second).usage.cached_prompt_tokens > 0


def test_chat_uses_the_checkpoint_template(stub: pb_grpc.InferenceStub, checkpoint: Path) -> None:
    request = pb.GenerateRequest(
        model="tiny", messages=[pb.ChatMessage(role="user", content="hi")], max_tokens=3
    )
    request.temperature = 0  # sampled, the random weights sometimes emit <|im_end|> early
    events = collect(stub.Generate(request))
    # The prompt is exactly what transformers renders and tokenizes for this conversation.
    from transformers import AutoTokenizer  # imported where needed: it takes seconds

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    expected: Any = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=True
    )
    assert events[0].started.prompt_tokens == len(expected["input_ids"])
    assert finished_of(events).usage.completion_tokens == 3
    loaded = {m.name: m for m in stub.ListModels(pb.ListModelsRequest()).models}
    assert loaded["tiny"].backend == "mlx-lm"
    assert Path(loaded["tiny"].source).name == "tiny"


def test_a_grammar_on_a_checkpoint_is_refused_naming_the_backend(
    stub: pb_grpc.InferenceStub,
) -> None:
    request = pb.GenerateRequest(model="tiny", prompt="Hi", grammar='root ::= "a"', max_tokens=2)
    with pytest.raises(grpc.RpcError) as caught:
        collect(stub.Generate(request))
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "use a GGUF model" in (caught.value.details() or "")
    # The model goes on serving.
    request.ClearField("grammar")
    assert finished_of(collect(stub.Generate(request))).usage.completion_tokens > 0
