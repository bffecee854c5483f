"""`POST /v1/embeddings` as RAG stacks call it (issue 40): the official SDK, litellm and
LangChain's OpenAIEmbeddings against a live server with the embedded all-MiniLM-L6-v2.

Every shape of `input` OpenAI takes, both encodings, `dimensions`, the errors, and
every body validated against OpenAI's own schema (tests/openai_schema.py). Offline:
litellm reads its model cost map locally when LITELLM_LOCAL_MODEL_COST_MAP is set,
and LangChain is told not to count tokens with tiktoken (`check_embedding_ctx_length`),
which would fetch an encoding from the network; then it sends the texts as they are.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import grpc
import httpx2 as httpx
import numpy as np
import openai
import pytest

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from service.models.embedded import MINILM_NAME
from tests.conftest import RunningServer, make_settings, serving
from tests.openai_schema import validate

FOOD = ["A man is eating food.", "A man is eating a piece of bread.", "The new movie is awesome."]


@pytest.fixture(scope="module")
def running() -> Iterator[RunningServer]:
    with serving(make_settings(http_listen="127.0.0.1:0")) as (server, _):
        yield server


def root(running: RunningServer) -> str:
    assert running.server.http is not None
    return f"http://127.0.0.1:{running.server.http.port}"


@pytest.fixture(scope="module")
def client(running: RunningServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=root(running) + "/v1", api_key="unused") as opened:
        yield opened


def _post(running: RunningServer, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(root(running) + "/v1/embeddings", json=body, timeout=60)


def test_the_sdk_embeds_texts_with_meaning(client: openai.OpenAI) -> None:
    answer = client.embeddings.create(model=MINILM_NAME, input=FOOD)
    vectors = np.array([item.embedding for item in answer.data])
    assert [item.index for item in answer.data] == [0, 1, 2]
    assert vectors.shape == (3, 384)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2] + 0.4
    assert answer.usage.prompt_tokens == answer.usage.total_tokens > 0


def test_base64_is_the_same_vectors(client: openai.OpenAI, running: RunningServer) -> None:
    floats = client.embeddings.create(model=MINILM_NAME, input=FOOD[0])
    # The SDK asks for base64 by default and decodes it; the raw body too.
    raw = _post(running, {"model": MINILM_NAME, "input": FOOD[0], "encoding_format": "base64"})
    decoded = np.frombuffer(base64.b64decode(raw.json()["data"][0]["embedding"]), "<f4")
    assert np.allclose(decoded, floats.data[0].embedding, atol=1e-7)


@pytest.mark.parametrize(
    "given",
    [
        "Hello world",
        ["Hello world", "Goodbye"],
        [101, 7592, 2088, 102],  # token ids of [CLS] hello world [SEP]
        [[101, 7592, 2088, 102], [101, 2204, 102]],
    ],
)
def test_every_input_shape_openai_takes(running: RunningServer, given: object) -> None:
    answer = _post(running, {"model": MINILM_NAME, "input": given, "encoding_format": "float"})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    validate(body, "CreateEmbeddingResponse")
    expected = len(given) if isinstance(given, list) and not isinstance(given[0], int) else 1
    assert len(body["data"]) == expected


def test_an_empty_model_is_the_default_embedding_model(running: RunningServer) -> None:
    answer = _post(running, {"input": "Hello world", "model": ""})
    assert answer.status_code == 200, answer.text
    assert answer.json()["model"] == MINILM_NAME


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"input": []}, "`input` must be"),
        ({"input": [1, "two"]}, "`input[0]`"),
        ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "x", "dimensions": 128}, "384 dimensions"),
        ({"input": "word " * 600}, "window of 512 tokens"),
        ({"input": "x", "model": "smollm2-135m-instruct"}, "call Generate"),
    ],
)
def test_what_is_refused_is_a_400_in_openais_shape(
    running: RunningServer, body: dict[str, Any], says: str
) -> None:
    answer = _post(running, {"model": MINILM_NAME, **body})
    assert answer.status_code == 400, answer.text
    validate(answer.json(), "ErrorResponse")
    assert says in answer.json()["error"]["message"]


def test_nulls_and_unknown_fields_are_accepted(running: RunningServer) -> None:
    body = {"model": MINILM_NAME, "input": "x", "dimensions": None, "user": "u-1", "shiny": 1}
    answer = _post(running, body)
    assert answer.status_code == 200, answer.text


def test_litellm_embeds(running: RunningServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    answer = litellm.embedding(
        model=f"openai/{MINILM_NAME}", input=FOOD, api_base=root(running) + "/v1", api_key="x"
    )
    vectors = np.array([item["embedding"] for item in answer.data])
    assert vectors.shape == (3, 384)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2]


def test_langchain_embeds_documents_and_a_query(running: RunningServer) -> None:
    from langchain_openai import OpenAIEmbeddings

    with openai.DefaultHttpxClient() as http:  # closed here: LangChain leaves its own open
        embeddings = OpenAIEmbeddings(
            model=MINILM_NAME,
            base_url=root(running) + "/v1",
            api_key="x",  # type: ignore[arg-type]
            check_embedding_ctx_length=False,
            http_client=http,
        )
        documents = np.array(embeddings.embed_documents(FOOD))
        query = np.array(embeddings.embed_query("Someone is having a meal"))
    assert documents.shape == (3, 384)
    scores = documents @ query
    assert int(np.argmax(scores)) in (0, 1)  # the meals, not the movie
    assert scores[2] < min(scores[0], scores[1])


def test_grpc_and_http_give_the_same_vectors(running: RunningServer, client: openai.OpenAI) -> None:
    with grpc.insecure_channel(running.target) as channel:
        reply = pb_grpc.InferenceStub(channel).Embed(
            pb.EmbedRequest(inputs=[pb.EmbedInput(text=FOOD[0])])
        )
    http = client.embeddings.create(model=MINILM_NAME, input=FOOD[0], encoding_format="float")
    assert np.allclose(reply.embeddings[0].values, http.data[0].embedding, atol=1e-4)
