"""Admission's checks of a GGUF file against what llama.cpp needs, on mutated real models.

Each case edits the header of the embedded SmolLM2 (llama) or Gemma 3 file in one
way that, loaded by llama.cpp in a child process, aborted or hung the process or
failed its load; admission must refuse it, saying what is wrong. The last tests
throw seeded mutations at admission and load every one it admits in a child
process, which must not die by a signal: that is what shows the checks cover
what crashes.
"""

from __future__ import annotations

import math
import os
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import gguf
import pytest

from service.admission import Capability, Decision, decide, describe
from service.model_source import ModelSource
from service.models.embedded import EMBEDDED_MODELS
from tests import gguf_mutations as gm
from tests.conftest import GEMMA, SMOLLM
from tests.fixtures import Q, write_checkpoint, write_gguf_header
from tests.llama_child import load_in_children

Edit = Callable[[gm.Template], None]


@pytest.fixture(scope="module")
def smol() -> gm.Template:
    return gm.Template.parse(EMBEDDED_MODELS[SMOLLM].locate())


@pytest.fixture(scope="module")
def gemma() -> gm.Template:
    return gm.Template.parse(EMBEDDED_MODELS[GEMMA].locate())


def decision(path: Path) -> Decision:
    return decide(ModelSource("gguf", path), Capability.TEXT, offline=True)


def refusal(template: gm.Template, edit: Edit, directory: Path) -> str:
    edited = template.clone()
    edit(edited)
    answer = decision(gm.write(edited.encode(), directory / "edited.gguf"))
    assert not answer.admitted
    assert answer.backend == "llama.cpp"
    return answer.reason


def put(key: str, value_type: int, value: object) -> Edit:
    def edit(template: gm.Template) -> None:
        name = key.replace("{arch}", template.architecture)
        if value_type == gm.STRING:
            template.put_string(name, str(value))
        else:
            template.put_scalar(name, value_type, value)

    return edit


def drop(key: str) -> Edit:
    return lambda template: template.drop(key)


def tensor(name: str, change: Callable[[gm.TensorSpec], None], relayout: bool = True) -> Edit:
    def edit(template: gm.Template) -> None:
        change(template.tensor(name))
        if relayout:
            template.relayout()

    return edit


def both(*edits: Edit) -> Edit:
    def edit(template: gm.Template) -> None:
        for each in edits:
            each(template)

    return edit


def set_dims(*dims: int) -> Callable[[gm.TensorSpec], None]:
    return lambda spec: setattr(spec, "dims", list(dims))


def set_type(ggml_type: int) -> Callable[[gm.TensorSpec], None]:
    return lambda spec: setattr(spec, "ggml_type", ggml_type)


U32, F32 = gm.U32, gm.F32

SMOL_CASES: list[tuple[str, Edit, str]] = [
    # What aborted llama.cpp (SIGABRT) in the probe, at load or at the first decode.
    (
        "block count 0",
        put("{arch}.block_count", U32, 0),
        "llama.block_count is 0; llama.cpp supports 1 to 512 layers",
    ),
    (
        "block count 600",
        put("{arch}.block_count", U32, 600),
        "llama.block_count is 600; llama.cpp supports 1 to 512 layers",
    ),
    (
        "next-n layers",
        put("{arch}.nextn_predict_layers", U32, 31),
        "llama.nextn_predict_layers is 31, more than llama.block_count (30)",
    ),
    (
        "experts, none used",
        put("{arch}.expert_count", U32, 8),
        "llama.expert_count is 8, but llama.expert_used_count is 0 or absent",
    ),
    (
        "experts used, none there",
        put("{arch}.expert_used_count", U32, 2),
        "llama.expert_used_count is 2, but the model has no experts",
    ),
    (
        "expert groups, no experts",
        put("{arch}.expert_group_count", U32, 2),
        "llama.expert_group_count is 2, but the model has no experts",
    ),
    (
        "too many experts",
        both(put("{arch}.expert_count", U32, 2000), put("{arch}.expert_used_count", U32, 2)),
        "llama.cpp supports at most 1024 experts",
    ),
    (
        "more used than there",
        both(put("{arch}.expert_count", U32, 4), put("{arch}.expert_used_count", U32, 5)),
        "llama.expert_used_count is 5, more than llama.expert_count (4)",
    ),
    (
        "groups not dividing",
        both(
            put("{arch}.expert_count", U32, 8),
            put("{arch}.expert_used_count", U32, 2),
            put("{arch}.expert_group_count", U32, 3),
        ),
        "is 3, which does not divide the 8 experts",
    ),
    (
        "no group used",
        both(
            put("{arch}.expert_count", U32, 8),
            put("{arch}.expert_used_count", U32, 2),
            put("{arch}.expert_group_count", U32, 4),
        ),
        "with 4 expert groups it must be between 1 and 3",
    ),
    (
        "rope scaling type",
        put("{arch}.rope.scaling.type", gm.STRING, "bogus"),
        "llama.rope.scaling.type is 'bogus'; llama.cpp knows none, linear, yarn, longrope",
    ),
    (
        "NaN epsilon",
        put("{arch}.attention.layer_norm_rms_epsilon", F32, math.nan),
        "layer_norm_rms_epsilon is nan; ggml's norms need a finite number >= 0",
    ),
    (
        "negative epsilon",
        put("{arch}.attention.layer_norm_rms_epsilon", F32, -1.0),
        "is -1.0; ggml's norms need",
    ),
    (
        "no vocabulary type",
        put("tokenizer.ggml.model", gm.STRING, "none"),
        "the model has no vocabulary",
    ),
    (
        "BOS added, none",
        both(
            put("tokenizer.ggml.pre", gm.STRING, "glm4"),  # a pre-tokenizer with no default BOS
            put("tokenizer.ggml.add_bos_token", gm.BOOL, True),
            drop("tokenizer.ggml.bos_token_id"),
        ),
        "add_bos_token is true, but tokenizer.ggml.bos_token_id names no token of the "
        "49152-token vocabulary and the tokenizer has no default",
    ),
    (
        "duplicate tokens",
        lambda t: gm.copy_token(t, 5, 49_000),
        "tokens 5 and 49000 of tokenizer.ggml.tokens are the same text",
    ),
    # What crashed it (SIGSEGV, SIGABRT) at the first decode.
    (
        "integer weights",
        tensor("blk.0.attn_q.weight", set_type(int(Q.I32))),
        "tensor 'blk.0.attn_q.weight' is stored as i32",
    ),
    ("F64 weights", tensor("blk.3.ffn_up.weight", set_type(int(Q.F64))), "is stored as f64"),
    (
        "Q8_K weights",
        tensor("blk.0.ffn_down.weight", set_type(int(Q.Q8_K))),
        "tensor 'blk.0.ffn_down.weight' is stored as q8_K",
    ),
    (
        "F16 norm",
        tensor("blk.8.ffn_norm.weight", set_type(int(Q.F16))),
        "'blk.8.ffn_norm.weight' is a norm or a vector stored as f16",
    ),
    (
        "Q4_0 norm",
        tensor("output_norm.weight", set_type(int(Q.Q4_0))),
        "'output_norm.weight' is a norm or a vector stored as q4_0",
    ),
    (
        "alignment 8",
        both(
            put("general.alignment", U32, 8),
            lambda t: setattr(t, "alignment", 8),
            gm.Template.relayout,
        ),
        "the data of tensor 'token_embd.weight' starts at byte 1785704 of the file, "
        "not a multiple of 32",
    ),
    # What llama.cpp refused at load, refused here first with the numbers.
    (
        "block count 29",
        put("{arch}.block_count", U32, 29),
        "tensor 'blk.29.attn_norm.weight' belongs to block 29, but llama.block_count is 29",
    ),
    (
        "block count 31",
        put("{arch}.block_count", U32, 31),
        "llama.block_count is 31, but block 30 has no tensors",
    ),
    (
        "block count a string",
        put("{arch}.block_count", gm.STRING, "abc"),
        "llama.block_count is stored as STRING; llama.cpp reads it only as UINT32",
    ),
    ("block count a UINT64", put("{arch}.block_count", gm.U64, 30), "is stored as UINT64"),
    (
        "no embedding length",
        drop("llama.embedding_length"),
        "the file has no llama.embedding_length",
    ),
    (
        "KV heads not dividing",
        put("{arch}.attention.head_count_kv", U32, 2),
        "layer 0 has 9 attention heads and 2 KV heads",
    ),
    (
        "no KV heads",
        put("{arch}.attention.head_count_kv", U32, 0),
        "llama.attention.head_count_kv is 0 for every layer",
    ),
    (
        "heads not dividing the width",
        put("{arch}.embedding_length", U32, 577),
        "llama.embedding_length (577) is not a multiple of llama.attention.head_count (9)",
    ),
    (
        "per-layer array too short",
        lambda t: t.put_array("llama.attention.head_count", U32, [9] * 29),
        "llama.attention.head_count has 29 values; llama.block_count is 30",
    ),
    (
        "per-layer array of floats",
        lambda t: t.put_array("llama.attention.head_count", F32, [9.0] * 30),
        "is an array of FLOAT32",
    ),
    (
        "rope narrower than the head",
        put("{arch}.rope.dimension_count", U32, 32),
        "llama.rope.dimension_count is 32; llama.cpp's llama needs the head size (64)",
    ),
    (
        "context length",
        put("{arch}.context_length", U32, 2**32 - 1),
        "llama.context_length is 4294967295; llama.cpp holds it in a signed 32-bit count",
    ),
    (
        "width",
        both(put("{arch}.embedding_length", U32, 1152), drop("llama.rope.dimension_count")),
        "tensor 'token_embd.weight' has shape (576, 49152); "
        "the hyper-parameters make it (1152, 49152)",
    ),
    (
        "feed-forward width",
        put("{arch}.feed_forward_length", U32, 1535),
        "tensor 'blk.0.ffn_down.weight' has shape (1536, 576); "
        "the hyper-parameters make it (1535, 576)",
    ),
    (
        "query shape",
        tensor("blk.0.attn_q.weight", set_dims(576, 512)),
        "tensor 'blk.0.attn_q.weight' has shape (576, 512); "
        "the hyper-parameters make it (576, 576)",
    ),
    (
        "vocabulary",
        tensor("token_embd.weight", set_dims(576, 49151)),
        "token_embd.weight has 49151 rows, "
        "but the vocabulary (tokenizer.ggml.tokens) has 49152 tokens",
    ),
    (
        "missing tensor",
        both(lambda t: t.tensors.remove(t.tensor("blk.5.attn_q.weight")), gm.Template.relayout),
        "the file has no tensor blk.5.attn_q.weight",
    ),
    ("no vocabulary", drop("tokenizer.ggml.tokens"), "the file has no vocabulary"),
    (
        "unknown tokenizer",
        put("tokenizer.ggml.model", gm.STRING, "bogus"),
        "tokenizer.ggml.model is 'bogus'; llama.cpp knows llama, bert, gpt2",
    ),
    ("no architecture", drop("general.architecture"), "names no general.architecture"),
    # The file: tensor infos and where their data lies.
    (
        "data past the end",
        lambda t: setattr(t, "data_bytes", t.data_bytes // 2),
        "past the end of the file",
    ),
    (
        "offset moved",
        tensor("blk.0.attn_q.weight", lambda s: setattr(s, "offset", s.offset + 1), relayout=False),
        "llama.cpp expects",
    ),
    (
        "zero dimension",
        tensor("blk.0.attn_norm.weight", set_dims(0)),
        "tensor 'blk.0.attn_norm.weight' has a dimension of 0",
    ),
    (
        "negative dimension",
        tensor("blk.0.attn_norm.weight", set_dims(-576)),
        "has a negative dimension",
    ),
    (
        "overflowing shape",
        tensor("blk.0.attn_norm.weight", set_dims(2**62, 2**62), relayout=False),
        "more elements than ggml can count",
    ),
    (
        "row not whole blocks",
        tensor("blk.0.attn_q.weight", set_type(int(Q.Q4_K))),
        "has 576 elements per row; its type q4_K packs them in blocks of 256",
    ),
    (
        "type from the future",
        tensor("blk.0.attn_q.weight", set_type(4000), relayout=False),
        "cannot decode tensor type 4000",
    ),
]


@pytest.mark.parametrize(
    ("edit", "expected"), [case[1:] for case in SMOL_CASES], ids=[case[0] for case in SMOL_CASES]
)
def test_a_broken_smollm2_is_refused_with_what_is_wrong(
    smol: gm.Template, tmp_path: Path, edit: Edit, expected: str
) -> None:
    assert expected in refusal(smol, edit, tmp_path)


def test_a_truncated_file_is_refused_naming_the_tensor_and_the_bytes(
    smol: gm.Template, tmp_path: Path
) -> None:
    reason = refusal(smol, lambda t: setattr(t, "data_bytes", t.data_bytes - 1), tmp_path)
    match = re.fullmatch(
        r"the data of tensor '([\w.]+)' ends at byte (\d+), past the end of the file "
        r"\((\d+) bytes\): the file is truncated",
        reason,
    )
    assert match is not None, reason
    assert int(match.group(2)) > int(match.group(3))


GEMMA_CASES: list[tuple[str, Edit, str]] = [
    # Gemma 3 lets the rotary dimensions differ from the head size: an odd count or
    # one past the head aborted at the first decode, and 0 hung it.
    (
        "rope 0",
        put("{arch}.rope.dimension_count", U32, 0),
        "gemma3.rope.dimension_count is 0; rotary embeddings turn pairs of values, "
        "so it must be even and between 2 and the head size (256)",
    ),
    (
        "rope odd",
        put("{arch}.rope.dimension_count", U32, 63),
        "is 63; rotary embeddings turn pairs",
    ),
    (
        "rope wider than the head",
        put("{arch}.rope.dimension_count", U32, 512),
        "is 512; rotary embeddings",
    ),
    (
        "block count 600",
        put("{arch}.block_count", U32, 600),
        "gemma3.block_count is 600; llama.cpp supports 1 to 512 layers",
    ),
    (
        "sliding window near 2^31",  # the generator found this one aborting
        put("{arch}.attention.sliding_window", U32, 2**31),
        "gemma3.attention.sliding_window is 2147483648; llama.cpp's 32-bit arithmetic",
    ),
    (
        "key length",
        put("{arch}.attention.key_length", U32, 128),
        "tensor 'blk.0.attn_k.weight' has shape (640, 256); "
        "the hyper-parameters make it (640, 128)",
    ),
]


@pytest.mark.parametrize(
    ("edit", "expected"), [case[1:] for case in GEMMA_CASES], ids=[case[0] for case in GEMMA_CASES]
)
def test_a_broken_gemma3_is_refused_with_what_is_wrong(
    gemma: gm.Template, tmp_path: Path, edit: Edit, expected: str
) -> None:
    assert expected in refusal(gemma, edit, tmp_path)


# --- what must still be admitted -----------------------------------------------------------


def test_the_embedded_models_and_their_rewritten_copies_are_admitted(
    smol: gm.Template, gemma: gm.Template, tmp_path: Path
) -> None:
    for model in (SMOLLM, GEMMA):
        answer = decision(EMBEDDED_MODELS[model].locate())
        assert answer.admitted, answer.reason
    for name, template in (("smol", smol), ("gemma", gemma)):
        copy = gm.write(template.encode(), tmp_path / f"{name}.gguf")  # header, then a hole
        answer = decision(copy)
        assert answer.admitted, answer.reason
        assert answer.description is not None
        assert not answer.description.defect


@pytest.mark.parametrize(
    ("architecture", "file_type", "types"),
    [
        ("llama", gguf.LlamaFileType.MOSTLY_Q4_K_M, [Q.Q4_K, Q.Q6_K]),
        ("llama", gguf.LlamaFileType.MOSTLY_Q8_0, [Q.Q8_0]),
        ("llama", gguf.LlamaFileType.MOSTLY_F16, [Q.F16]),
        ("gemma3", gguf.LlamaFileType.MOSTLY_BF16, [Q.BF16]),
        ("gpt-oss", gguf.LlamaFileType.MOSTLY_MXFP4_MOE, [Q.MXFP4, Q.F32]),
        ("qwen2", None, [Q.Q4_0]),
    ],
)
def test_the_fixture_headers_are_admitted(
    tmp_path: Path, architecture: str, file_type: gguf.LlamaFileType | None, types: list[Q]
) -> None:
    path = write_gguf_header(tmp_path / "model.gguf", architecture, file_type, types)
    answer = decision(path)
    assert answer.admitted, answer.reason


# --- costs ---------------------------------------------------------------------------------


def test_a_broken_file_is_judged_once_per_version_of_it(smol: gm.Template, tmp_path: Path) -> None:
    """Refusals are cached like admissions (by path, size and mtime): a client retrying
    a broken file costs a stat, not another read of its header."""
    broken = gm.write(gm.hparam("{arch}.block_count", U32, 600).image(smol), tmp_path / "b.gguf")
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"GGUF" + bytes(range(256)) * 64)
    for path in (broken, garbage):
        first = decision(path)
        hits = describe._describe_gguf_cached.cache_info().hits
        again = decision(path)
        assert describe._describe_gguf_cached.cache_info().hits == hits + 1
        assert (again.admitted, again.reason) == (False, first.reason)


# --- generated mutations -------------------------------------------------------------------

# Enough mutations that a few dozen are admitted, few enough that loading those
# takes tens of seconds on two cores. Gemma 3 (sliding-window attention, 6.5 MB
# headers, slower loads) gets fewer.
CAMPAIGNS = {SMOLLM: 200, GEMMA: 40}
SEED = 15

Judged = list[tuple[gm.Mutation, Path, Decision]]


@pytest.fixture(scope="module", params=list(CAMPAIGNS))
def judged(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Judged]:
    model: str = request.param
    template = gm.Template.parse(EMBEDDED_MODELS[model].locate())
    directory = tmp_path_factory.mktemp("mutations")
    mutations = gm.generate(template, SEED, CAMPAIGNS[model])
    yield [(m, path, decision(path)) for m, path in gm.written(mutations, template, directory)]
    shutil.rmtree(directory)  # the headers take a few hundred MB; pytest keeps old runs


@pytest.mark.slow  # the campaigns: thousands of mutated headers judged
def test_every_generated_mutation_gets_an_answer(judged: Judged) -> None:
    """Admission never raises on a model file: each mutation is admitted, or refused
    with a reason; and the seed reaches every family and both answers."""
    for mutation, _, answer in judged:
        assert answer.admitted or answer.reason, mutation.name
    families = {(m.family, answer.admitted) for m, _, answer in judged}
    assert {("structure", False), ("hparam", False), ("tensor", False)} <= families
    assert any(answer.admitted for _, _, answer in judged)


def test_every_admitted_mutation_runs_without_killing_its_process(judged: Judged) -> None:
    admitted = [(mutation, path) for mutation, path, answer in judged if answer.admitted]
    outcomes = load_in_children([path for _, path in admitted])
    killed = [
        f"{mutation.name}: {outcome.kind} ({outcome.detail[:200]})"
        for (mutation, _), outcome in zip(admitted, outcomes, strict=True)
        if outcome.killed
    ]
    assert not killed
    # The child did load and decode: most admitted mutations run, the rest raise.
    assert sum(outcome.kind == "ok" for outcome in outcomes) >= len(outcomes) // 2


def test_the_child_process_reports_a_crash(smol: gm.Template, tmp_path: Path) -> None:
    """The harness above can fail: an unchecked file that aborts llama.cpp is seen as killed."""
    path = gm.write(gm.hparam("{arch}.block_count", U32, 600).image(smol), tmp_path / "b.gguf")
    (outcome,) = load_in_children([path])
    assert (outcome.kind, outcome.killed) == ("killed", True)
    assert outcome.detail.startswith("SIGABRT")


def test_a_path_that_is_not_a_regular_file_is_refused_without_opening_it(tmp_path: Path) -> None:
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)  # opening it to read would wait for a writer for ever
    answer = decision(fifo)
    assert (answer.admitted, answer.reason) == (False, "the model is not a regular file")


def test_a_token_to_add_falls_back_to_the_tokenizers_default(
    smol: gm.Template, tmp_path: Path
) -> None:
    """An EOS id outside the vocabulary: llama.cpp adds its gpt2 default (11) instead,
    which runs, so admission lets it through."""
    edited = smol.clone()
    edited.put_scalar("tokenizer.ggml.add_eos_token", gm.BOOL, True)
    edited.put_scalar("tokenizer.ggml.eos_token_id", U32, 60_000)
    assert decision(gm.write(edited.encode(), tmp_path / "eos.gguf")).admitted


def test_a_checkpoint_whose_weights_cannot_be_read_is_refused(tmp_path: Path) -> None:
    checkpoint = write_checkpoint(tmp_path / "ckpt", {"model_type": "llama"})
    (checkpoint / "model.safetensors").symlink_to(tmp_path / "gone")
    answer = decide(ModelSource("checkpoint", checkpoint), Capability.TEXT, offline=True)
    assert not answer.admitted
    assert answer.reason == "'model.safetensors' cannot be read: No such file or directory"
