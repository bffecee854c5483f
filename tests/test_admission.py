"""Admission: what a model is and whether this build serves it, from metadata alone."""

from __future__ import annotations

import random
import shutil
from collections.abc import Iterator
from pathlib import Path

import gguf
import grpc
import pytest

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from service.admission import gates, ggml_types
from service.admission.quantization import QuantScheme, from_checkpoint_config
from service.models.embedded import EMBEDDED_MODELS
from tests import gguf_mutations as gm
from tests.conftest import SMOLLM, collect, finished_of, make_settings, serving
from tests.fixtures import Q, write_checkpoint, write_gguf_header, write_hub_snapshot

FT = gguf.LlamaFileType


# --- the layout vocabulary, from config.json blocks ---------------------------------------


@pytest.mark.parametrize(
    ("config", "scheme", "method", "bits", "group"),
    [
        ({"torch_dtype": "bfloat16"}, QuantScheme.UNQUANTIZED, "bfloat16", 16, 0),
        (
            {"quantization": {"bits": 4, "group_size": 64}},
            QuantScheme.AFFINE_GROUP_INT,
            "affine",
            4,
            64,
        ),
        (
            {"quantization": {"bits": 4, "group_size": 32, "mode": "mxfp4"}},
            QuantScheme.BLOCK_SCALED_FLOAT,
            "mxfp4",
            4,
            32,
        ),
        (
            {"quantization": {"bits": 8, "group_size": 32, "mode": "mxfp8"}},
            QuantScheme.BLOCK_SCALED_FLOAT,
            "mxfp8",
            8,
            32,
        ),
        (
            {"quantization": {"bits": 4, "group_size": 16, "mode": "nvfp4"}},
            QuantScheme.BLOCK_SCALED_FLOAT,
            "nvfp4",
            4,
            16,
        ),
        (
            {"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128}},
            QuantScheme.UNKNOWN_METHOD,
            "awq",
            4,
            128,
        ),
        (
            {"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128}},
            QuantScheme.UNKNOWN_METHOD,
            "gptq",
            4,
            128,
        ),
        (
            {"quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": True}},
            QuantScheme.UNKNOWN_METHOD,
            "bitsandbytes",
            0,
            0,
        ),
    ],
)
def test_checkpoint_quantization_is_classified(
    config: dict[str, object], scheme: QuantScheme, method: str, bits: int, group: int
) -> None:
    quantization = from_checkpoint_config(config)
    assert (quantization.scheme, quantization.method) == (scheme, method)
    assert (quantization.bits, quantization.group_size) == (bits, group)


# --- gates asked of the libraries ---------------------------------------------------------


def test_llama_cpp_is_asked_about_architectures() -> None:
    assert gates.llama_cpp_knows_architecture("llama")
    assert gates.llama_cpp_knows_architecture("gemma3")
    assert not gates.llama_cpp_knows_architecture("not_a_real_architecture_9f3c")


def test_ggml_says_which_tensor_types_it_decodes() -> None:
    assert ggml_types.type_problem(int(Q.Q4_K)) is None
    assert ggml_types.type_problem(int(Q.MXFP4)) is None
    assert "REMOVED" in (ggml_types.type_problem(31) or "")  # Q4_0_4_4, repacked at run time now
    assert "newer than this build" in (ggml_types.type_problem(4000) or "")
    # ggml's own sizes, not the gguf package's table (which says 40 bytes for Q8_1).
    assert (ggml_types.block_size(int(Q.Q8_1)), ggml_types.block_bytes(int(Q.Q8_1))) == (32, 36)


def test_mlx_lm_is_asked_through_its_own_registry() -> None:
    assert gates.mlx_lm_model_module({"model_type": "llama"}) == "mlx_lm.models.llama"
    # mlx-lm remaps mistral onto its llama module; a hand-kept list would have to know that.
    assert gates.mlx_lm_model_module({"model_type": "mistral"}) == "mlx_lm.models.llama"
    assert gates.mlx_lm_model_module({"model_type": "not_a_real_architecture_9f3c"}) is None


# --- the Admit RPC over a models dir and a hub cache ---------------------------------------


@pytest.fixture(scope="module")
def model_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("admission")
    models = root / "models"
    models.mkdir()
    write_gguf_header(models / "llama-q4km.gguf", "llama", FT.MOSTLY_Q4_K_M, [Q.Q4_K, Q.Q6_K])
    write_gguf_header(models / "llama-q8.gguf", "llama", FT.MOSTLY_Q8_0, [Q.Q8_0])
    write_gguf_header(models / "llama-f16.gguf", "llama", FT.MOSTLY_F16, [Q.F16])
    write_gguf_header(models / "oss-mxfp4.gguf", "gpt-oss", FT.MOSTLY_MXFP4_MOE, [Q.MXFP4, Q.F32])
    write_gguf_header(models / "future.gguf", "not_a_real_architecture_9f3c", None, [Q.Q4_0])
    write_checkpoint(
        models / "llama-bf16", {"model_type": "llama", "torch_dtype": "bfloat16"}, 4096
    )
    write_checkpoint(
        models / "qwen-4bit", {"model_type": "qwen2", "quantization": {"bits": 4, "group_size": 64}}
    )
    write_checkpoint(
        models / "oss-mxfp4",
        {"model_type": "gpt_oss", "quantization": {"bits": 4, "group_size": 32, "mode": "mxfp4"}},
    )
    for method in ("awq", "gptq", "bitsandbytes"):
        write_checkpoint(
            models / f"llama-{method}",
            {"model_type": "llama", "quantization_config": {"quant_method": method, "bits": 4}},
        )
    write_checkpoint(models / "novel", {"model_type": "not_a_real_architecture_9f3c"})
    shutil.copy(EMBEDDED_MODELS[SMOLLM].locate(), models / "smol.gguf")
    write_broken_models(models)
    outside = root / "outside"
    outside.mkdir()
    write_gguf_header(outside / "secret.gguf", "llama", FT.MOSTLY_Q8_0, [Q.Q8_0])
    (models / "escape.gguf").symlink_to(outside / "secret.gguf")
    hub = root / "hub"
    write_hub_snapshot(hub, "acme/tiny-llama", {"config.json": b'{"model_type": "llama"}'})
    q8 = (models / "llama-q8.gguf").read_bytes()
    q4 = (models / "llama-q4km.gguf").read_bytes()
    write_hub_snapshot(hub, "acme/tiny-gguf", {"tiny-Q8_0.gguf": q8, "tiny-Q4_K_M.gguf": q4})
    return root


def write_broken_models(models: Path) -> None:
    """Issue 15's inputs: GGUF files derived from the real SmolLM2, and config.json cases."""
    template = gm.Template.parse(EMBEDDED_MODELS[SMOLLM].locate())
    for name, mutation in BROKEN_GGUFS.items():
        gm.write(mutation.image(template), models / name)
    for name, config in BROKEN_CONFIGS.items():
        write_checkpoint(models / name, config)
    (models / "cfg-not-json").mkdir()
    (models / "cfg-not-json" / "config.json").write_text('{"model_type": "llama",')
    (models / "cfg-deep").mkdir()
    (models / "cfg-deep" / "config.json").write_text("[" * 5_000 + "]" * 5_000)


BROKEN_GGUFS = {
    "blocks-0.gguf": gm.hparam("{arch}.block_count", gm.U32, 0),
    "blocks-600.gguf": gm.hparam("{arch}.block_count", gm.U32, 600),
    "claims.gguf": gm.huge_tensor_count_sparse(),
    "garbage.gguf": gm.garbage_after_magic(random.Random(8)),
    "long-string.gguf": gm.string_length("general.name", 1 << 62),
    "nested.gguf": gm.nested_arrays(200_000),
    "truncated.gguf": gm.truncated(data_fraction=0.5),
}
BROKEN_CONFIGS: dict[str, dict[str, object]] = {
    "cfg-abc": {"model_type": "llama", "num_hidden_layers": "abc"},
    "cfg-dotted": {"model_type": "x.y"},
    "cfg-negative": {"model_type": "llama", "hidden_size": -64},
    "cfg-type-list": {"model_type": ["llama"]},
    "cfg-text-config": {"model_type": "llama", "text_config": [1, 2]},
}


@pytest.fixture(scope="module")
def admit_stub(model_tree: Path) -> Iterator[pb_grpc.InferenceStub]:
    settings = make_settings(
        models_dir=[model_tree / "models"], hf_cache_dir=model_tree / "hub", hf_offline=True
    )
    with serving(settings) as (_, stub):
        yield stub


def admit(stub: pb_grpc.InferenceStub, model: str) -> pb.AdmitResponse:
    reply: pb.AdmitResponse = stub.Admit(
        pb.AdmitRequest(model=model, capability=pb.CAPABILITY_TEXT)
    )
    return reply


S = pb.QuantizationScheme


@pytest.mark.parametrize(
    ("model", "backend", "arch", "scheme", "method", "bits", "group"),
    [
        (
            "llama-q4km.gguf",
            "llama.cpp",
            "llama",
            S.QUANTIZATION_SCHEME_GGUF_K_QUANT,
            "Q4_K_M",
            4,
            256,
        ),
        ("llama-q8.gguf", "llama.cpp", "llama", S.QUANTIZATION_SCHEME_GGUF_BLOCK, "Q8_0", 8, 32),
        ("llama-f16.gguf", "llama.cpp", "llama", S.QUANTIZATION_SCHEME_UNQUANTIZED, "F16", 16, 0),
        (
            "oss-mxfp4.gguf",
            "llama.cpp",
            "gpt-oss",
            S.QUANTIZATION_SCHEME_BLOCK_SCALED_FLOAT,
            "MXFP4_MOE",
            4,
            32,
        ),
        ("llama-bf16", "mlx-lm", "llama", S.QUANTIZATION_SCHEME_UNQUANTIZED, "bfloat16", 16, 0),
        ("qwen-4bit", "mlx-lm", "qwen2", S.QUANTIZATION_SCHEME_AFFINE_GROUP_INT, "affine", 4, 64),
        (
            "oss-mxfp4",
            "mlx-lm",
            "gpt_oss",
            S.QUANTIZATION_SCHEME_BLOCK_SCALED_FLOAT,
            "mxfp4",
            4,
            32,
        ),
    ],
)
def test_admit_answers_for_each_scheme(
    admit_stub: pb_grpc.InferenceStub,
    model: str,
    backend: str,
    arch: str,
    scheme: int,
    method: str,
    bits: int,
    group: int,
) -> None:
    reply = admit(admit_stub, model)
    assert reply.admitted, reply.reason
    assert (reply.backend, reply.architecture) == (backend, arch)
    quantization = reply.quantization
    assert (quantization.scheme, quantization.method) == (scheme, method)
    assert (quantization.bits, quantization.group_size) == (bits, group)
    assert reply.available_locally
    assert not reply.loaded


def test_admit_estimates_weights_and_kv_cache(
    admit_stub: pb_grpc.InferenceStub, model_tree: Path
) -> None:
    reply = admit(admit_stub, "llama-q4km.gguf")
    memory = reply.memory
    assert memory.weights_bytes == (model_tree / "models" / "llama-q4km.gguf").stat().st_size
    # 4 layers x 2 KV heads x (64 + 64) values x 2 bytes, for the 1024-token test context.
    assert memory.kv_cache_bytes == 4 * 2 * 128 * 2 * 1024
    # Conversations parked out of the cache may take one more KV cache of host memory.
    assert memory.parked_bytes == memory.kv_cache_bytes
    # On the CPU the compute buffer is touched only as far as a step reaches: not counted.
    assert memory.compute_bytes == 0
    assert memory.total_bytes == memory.weights_bytes + 2 * memory.kv_cache_bytes
    assert memory.fits
    checkpoint = admit(admit_stub, "llama-bf16").memory
    assert checkpoint.weights_bytes == 4096
    assert checkpoint.kv_cache_bytes == 2 * 2 * 2 * 16 * 2 * 1024
    assert checkpoint.parked_bytes == 0  # mlx-lm parks nothing
    assert checkpoint.compute_bytes == 0  # nor is its working memory estimated


@pytest.mark.parametrize("method", ["awq", "gptq", "bitsandbytes"])
def test_packed_quant_methods_are_refused_before_any_loader(
    admit_stub: pb_grpc.InferenceStub, method: str
) -> None:
    reply = admit(admit_stub, f"llama-{method}")
    assert not reply.admitted
    assert reply.quantization.scheme == S.QUANTIZATION_SCHEME_UNKNOWN_METHOD
    assert reply.quantization.method == method
    assert method in reply.reason
    assert "cannot decode" in reply.reason


@pytest.mark.parametrize("model", ["future.gguf", "novel"])
def test_unknown_architectures_are_refused_by_the_library(
    admit_stub: pb_grpc.InferenceStub, model: str
) -> None:
    reply = admit(admit_stub, model)
    assert not reply.admitted
    assert reply.architecture == "not_a_real_architecture_9f3c"
    assert "does not implement the architecture" in reply.reason


def test_generate_on_a_refused_model_fails_fast_with_the_same_reason(
    admit_stub: pb_grpc.InferenceStub,
) -> None:
    reason = admit(admit_stub, "llama-awq").reason
    with pytest.raises(grpc.RpcError) as caught:
        collect(admit_stub.Generate(pb.GenerateRequest(model="llama-awq", prompt="hi")))
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert reason in (caught.value.details() or "")


def test_a_path_under_the_models_dir_is_served(
    admit_stub: pb_grpc.InferenceStub, model_tree: Path
) -> None:
    absolute = str(model_tree / "models" / "smol.gguf")
    for model in ("smol.gguf", absolute):
        request = pb.GenerateRequest(model=model, prompt="Hello", max_tokens=2, temperature=0)
        events = collect(admit_stub.Generate(request))
        assert events[0].started.model == "smol.gguf"  # one model, however it is spelled
        assert finished_of(events).usage.completion_tokens == 2
    assert admit(admit_stub, "smol.gguf").loaded


@pytest.mark.parametrize(
    "model",
    [
        "../outside/secret.gguf",
        "sub/../../outside/secret.gguf",
        "escape.gguf",  # a symlink leading out of the models dir
        "/etc/passwd",
        "acme/tiny-gguf:../../../outside/secret.gguf",
    ],
)
def test_paths_outside_the_allowed_roots_are_refused(
    admit_stub: pb_grpc.InferenceStub, model_tree: Path, model: str
) -> None:
    for call in (
        lambda: admit(admit_stub, model),
        lambda: collect(admit_stub.Generate(pb.GenerateRequest(model=model, prompt="hi"))),
    ):
        with pytest.raises(grpc.RpcError) as caught:
            call()
        assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
    absolute_outside = str(model_tree / "outside" / "secret.gguf")
    with pytest.raises(grpc.RpcError) as caught:
        admit(admit_stub, absolute_outside)
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_hub_repos_resolve_through_the_cache_offline(admit_stub: pb_grpc.InferenceStub) -> None:
    checkpoint = admit(admit_stub, "acme/tiny-llama")
    assert checkpoint.admitted, checkpoint.reason
    assert (checkpoint.backend, checkpoint.architecture) == ("mlx-lm", "llama")
    assert checkpoint.available_locally
    assert admit(admit_stub, "acme/tiny-llama@main").admitted
    by_tag = admit(admit_stub, "acme/tiny-gguf:Q8_0")
    assert by_tag.quantization.method == "Q8_0"
    by_file = admit(admit_stub, "acme/tiny-gguf:tiny-Q4_K_M.gguf")
    assert by_file.quantization.method == "Q4_K_M"


def test_hub_repo_missing_from_the_cache_says_offline(admit_stub: pb_grpc.InferenceStub) -> None:
    reply = admit(admit_stub, "acme/not-downloaded")
    assert not reply.admitted
    assert not reply.available_locally
    assert "offline" in reply.reason
    with pytest.raises(grpc.RpcError) as caught:
        admit(admit_stub, "acme/tiny-gguf")  # two GGUF files: which one?
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "tiny-Q8_0.gguf" in (caught.value.details() or "")


def test_unknown_names_are_not_found(admit_stub: pb_grpc.InferenceStub) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        admit(admit_stub, "no-such-model.gguf")
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


# --- broken model files: refused with the reason, never an RPC error ----------------------


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("blocks-0.gguf", "llama.block_count is 0; llama.cpp supports 1 to 512 layers"),
        ("blocks-600.gguf", "llama.block_count is 600; llama.cpp supports 1 to 512 layers"),
        ("claims.gguf", "the header claims 1099511627776 tensors; the cap is 65536"),
        ("garbage.gguf", "not a readable GGUF file"),
        ("long-string.gguf", "claims a length of 4611686018427387904 bytes; the cap is"),
        ("nested.gguf", "holds an array of arrays"),
        ("truncated.gguf", "past the end of the file"),
        ("cfg-abc", 'config.json\'s num_hidden_layers is "abc" (a JSON string)'),
        ("cfg-dotted", "config.json's model_type 'x.y' is not a name a model module could have"),
        ("cfg-negative", "config.json's hidden_size is -64 (a JSON number); it must be a whole"),
        ("cfg-type-list", "config.json's model_type is"),
        ("cfg-text-config", "config.json's text_config is"),
        ("cfg-not-json", "config.json is not valid JSON"),
        ("cfg-deep", "config.json nests its values too deeply to read"),
    ],
)
def test_a_broken_model_is_refused_with_what_is_wrong(
    admit_stub: pb_grpc.InferenceStub, model: str, expected: str
) -> None:
    """Issue 15, items 2, 6 and 8: a refusal with the reason, then Generate fails at once
    with FAILED_PRECONDITION and that reason."""
    reply = admit(admit_stub, model)
    assert not reply.admitted
    assert expected in reply.reason
    assert reply.available_locally
    assert reply.backend == ("llama.cpp" if model.endswith(".gguf") else "mlx-lm")
    with pytest.raises(grpc.RpcError) as caught:
        collect(admit_stub.Generate(pb.GenerateRequest(model=model, prompt="hi", max_tokens=2)))
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert reply.reason in (caught.value.details() or "")


def test_the_server_serves_on_after_broken_models(admit_stub: pb_grpc.InferenceStub) -> None:
    """Refusing block counts of 0 and 600 kept llama.cpp from aborting the process."""
    for model in ("blocks-0.gguf", "blocks-600.gguf", "blocks-600.gguf"):
        assert not admit(admit_stub, model).admitted
    request = pb.GenerateRequest(model="smol.gguf", prompt="Hello", max_tokens=2, temperature=0)
    assert finished_of(collect(admit_stub.Generate(request))).usage.completion_tokens == 2
