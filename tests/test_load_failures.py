"""A model file that passes admission but that llama.cpp still refuses to load is the
caller's bad model: FAILED_PRECONDITION in llama.cpp's own words, and the server serves on."""

from __future__ import annotations

from pathlib import Path

import grpc
import llama_cpp
import pytest

from inference.v1 import inference_pb2 as pb
from service.backends.llama_cpp.log import recorded_native_errors
from service.models.embedded import EMBEDDED_MODELS
from tests.conftest import collect, finished_of, make_settings, serving
from tests.gguf_mutations import F64, Template, hparam, write


def test_llama_cpp_errors_are_recorded() -> None:
    with recorded_native_errors() as errors:
        model = llama_cpp.llama_model_load_from_file(
            b"/nonexistent/model.gguf", llama_cpp.llama_model_default_params()
        )
    assert not model
    assert any("failed to" in line or "error" in line for line in errors)


def test_a_file_llama_cpp_refuses_at_load_is_failed_precondition(tmp_path: Path) -> None:
    template = Template.parse(EMBEDDED_MODELS["smollm2-135m-instruct"].locate())
    # A vocabulary key of the wrong type: admission does not read the vocabulary's
    # keys, llama.cpp refuses the file cleanly when it loads it.
    mutation = hparam("tokenizer.ggml.bos_token_id", F64, 1e300)
    write(mutation.image(template), tmp_path / "wrong-type.gguf")
    with serving(make_settings(models_dir=[tmp_path])) as (_, stub):
        admitted = stub.Admit(pb.AdmitRequest(model="wrong-type.gguf"), timeout=60)
        request = pb.GenerateRequest(model="wrong-type.gguf", prompt="Hi", max_tokens=2)
        with pytest.raises(grpc.RpcError) as caught:
            collect(stub.Generate(request, timeout=60))
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        details = caught.value.details() or ""
        assert "llama.cpp cannot load wrong-type.gguf" in details
        assert "tokenizer.ggml.bos_token_id has wrong type f64" in details
        assert str(tmp_path) not in details  # the server's own paths stay private
        plain = pb.GenerateRequest(prompt="Hello", max_tokens=2, temperature=0)
        assert finished_of(collect(stub.Generate(plain, timeout=60))).usage.completion_tokens == 2
    assert admitted.admitted  # what this test is about: a file admission lets through
