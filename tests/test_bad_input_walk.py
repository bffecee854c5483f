"""Every field of every endpoint, on both ports, given the values clients get wrong
(issue 45): lone UTF-16 surrogates, integers past the wire types (2^31, 2^63, 2^64),
names the hub library refuses, and bytes that are not UTF-8 where text belongs.
Each must be answered as the client's mistake (4xx, or a gRPC status other than
INTERNAL and UNKNOWN), never as the server's; the server keeps serving after all
of them.

The fields walked are read from the code's own lists of what each endpoint serves
(and from the contract's descriptors for gRPC), so a field added later is walked too.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import grpc
import httpx2 as httpx
import pytest
from google.protobuf.descriptor import FieldDescriptor

from inference.v1 import inference_pb2 as pb
from service.front.openai_api import embeddings, responses_api, tokens
from service.front.openai_api.requests import CHAT_FIELDS, COMPLETION_FIELDS
from tests.conftest import RunningServer, make_settings, serving

TOKEN = "walk-token"
SURROGATES = ["\ud800", "ok \udfff ok"]
INTEGERS = [1 << 31, 1 << 63, -(1 << 63) - 1, 1 << 64]
HUB_NAMES = ["a--b/c", "a/b.", "a/b..c", "o" * 50 + "/" + "n" * 50]
BAD_VALUES: list[Any] = [*SURROGATES, *INTEGERS, *HUB_NAMES]

# A request each endpoint serves, which the walk spoils one field at a time.
HTTP_BASES: dict[str, tuple[dict[str, Any], frozenset[str]]] = {
    "/v1/chat/completions": (
        {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
        CHAT_FIELDS,
    ),
    "/v1/completions": ({"prompt": "Hi", "max_tokens": 2}, COMPLETION_FIELDS),
    "/v1/responses": (
        {"input": "Hi", "max_output_tokens": 2},
        responses_api.SERVED | responses_api.EXTENSIONS,
    ),
    "/v1/embeddings": ({"input": "Hi"}, embeddings._FIELDS),
    "/tokenize": ({"prompt": "Hi"}, tokens.TOKENIZE_FIELDS),
    "/detokenize": ({"tokens": [1, 2]}, tokens.DETOKENIZE_FIELDS),
}
# Values a level down, where a client's text and numbers sit.
NESTED: dict[str, list[dict[str, Any]]] = {
    "/v1/chat/completions": [{"messages": [{"role": "user", "content": BAD}]} for BAD in SURROGATES]
    + [{"messages": [{"role": BAD, "content": "Hi"}]} for BAD in SURROGATES]
    + [
        {"messages": [{"role": "user", "content": [{"type": "text", "text": SURROGATES[0]}]}]},
        {"tools": [{"type": "function", "function": {"name": SURROGATES[0]}}]},
        {"logit_bias": {str(1 << 31): 1}},
        {"stop": [SURROGATES[0]]},
    ],
    "/v1/completions": [{"prompt": [[1, 1 << 31]]}, {"prompt": [SURROGATES[0]]}],
    "/v1/responses": [
        {"input": [{"role": "user", "content": SURROGATES[0]}]},
        {"metadata": {SURROGATES[0]: "x"}},
        {"metadata": {"k": SURROGATES[0]}},
    ],
    "/v1/embeddings": [{"input": [SURROGATES[0]]}, {"input": [[1 << 31]]}],
    "/tokenize": [{"messages": [{"role": "user", "content": SURROGATES[0]}]}],
    "/detokenize": [{"tokens": [1 << 31]}, {"tokens": [1 << 63]}],
}


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    cache = tmp_path_factory.mktemp("hub-cache")
    settings = make_settings(
        http_listen="127.0.0.1:0",
        auth_token=TOKEN,
        allow_pull=True,
        hf_cache_dir=cache,
        # Nothing listens there: a name that passes every check fails to connect.
        hf_endpoint="http://127.0.0.1:9",
    )
    with serving(settings) as (server, _):
        yield server


def _http(running: RunningServer) -> httpx.Client:
    assert running.server.http is not None
    return httpx.Client(
        base_url=f"http://127.0.0.1:{running.server.http.port}",
        headers={"authorization": f"Bearer {TOKEN}"},
        timeout=60,
    )


def _post(client: httpx.Client, path: str, body: dict[str, Any]) -> str | None:
    """The failure, if `body` was answered as the server's fault."""
    raw = json.dumps(body)  # ensure_ascii: lone surrogates go as \\ud800 escapes
    answer = client.post(path, content=raw, headers={"content-type": "application/json"})
    if answer.status_code >= 500:
        return f"{path} {raw[:120]}: {answer.status_code} {answer.text[:200]}"
    return None


def test_every_http_field_refuses_bad_values_as_the_clients_mistake(
    running: RunningServer,
) -> None:
    failures = []
    with _http(running) as client:
        for path, (base, fields) in HTTP_BASES.items():
            for field in sorted(fields):
                for value in BAD_VALUES:
                    failures.append(_post(client, path, {**base, field: value}))
            for spoiled in NESTED[path]:
                failures.append(_post(client, path, {**base, **spoiled}))
        found = [failure for failure in failures if failure]
        assert not found, "\n".join(found)
        assert client.get("/v1/models").status_code == 200  # and it still serves


def test_a_lone_surrogate_is_refused_by_name(running: RunningServer) -> None:
    with _http(running) as client:
        raw = json.dumps({"messages": [{"role": "user", "content": "a\ud800"}]})
        answer = client.post("/v1/chat/completions", content=raw)
    assert answer.status_code == 400
    message = answer.json()["error"]["message"]
    assert "messages[0].content" in message
    assert "surrogate" in message


def test_max_tokens_past_int32_is_refused_naming_the_range(running: RunningServer) -> None:
    with _http(running) as client:
        answer = client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1 << 31})
    assert answer.status_code == 400
    assert str((1 << 31) - 1) in answer.json()["error"]["message"]


@pytest.mark.parametrize(
    "value", [b"Bearer \xff\xfe", b"\xc3\x28", b"Bearer " + TOKEN.encode() + b"\x80"]
)
def test_an_authorization_header_that_is_not_utf8_is_401(
    running: RunningServer, value: bytes
) -> None:
    with _http(running) as client:
        answer = client.post(
            "/v1/completions",
            content=b'{"prompt": "Hi", "max_tokens": 2}',
            headers={b"authorization": value},
        )
    assert answer.status_code == 401


# --- gRPC -------------------------------------------------------------------------

GRPC_BASES: dict[str, Any] = {
    "Admit": pb.AdmitRequest(model="smollm2-135m-instruct"),
    "Generate": pb.GenerateRequest(prompt="Hi", max_tokens=2),
    "Tokenize": pb.TokenizeRequest(prompt="Hi"),
    "Detokenize": pb.DetokenizeRequest(token_ids=[1, 2]),
    "GenerateImage": pb.GenerateImageRequest(prompt="a cat"),
    "ListModels": pb.ListModelsRequest(),
    "Pull": pb.PullRequest(model="test/smol"),
    "ListCached": pb.ListCachedRequest(),
    "DeleteCached": pb.DeleteCachedRequest(),
    "Embed": pb.EmbedRequest(inputs=[pb.EmbedInput(text="Hi")]),
}
_INTEGER_TYPES = {
    FieldDescriptor.TYPE_INT32: [(1 << 31) - 1, -(1 << 31)],
    FieldDescriptor.TYPE_INT64: [(1 << 63) - 1, -(1 << 63)],
    FieldDescriptor.TYPE_UINT32: [(1 << 32) - 1, 1 << 31],
    FieldDescriptor.TYPE_UINT64: [(1 << 64) - 1, 1 << 63],
}
# Bytes in place of a string's text: a CESU-8 surrogate, a stray byte, a cut sequence.
_NOT_UTF8 = [b"\xed\xa0\x80", b"\xff", b"A\xc3"]
_MARK = "MARKMARK"


def _spoiled(base: Any) -> Iterator[tuple[str, bytes]]:
    """`base` serialized with one field at a time given a bad value (strings: invalid
    hub names and, spliced into the bytes, text that is not UTF-8)."""
    for field in base.DESCRIPTOR.fields:
        if field.message_type is not None:
            continue
        repeated = field.is_repeated
        values: list[Any] = []
        if field.type == FieldDescriptor.TYPE_STRING:
            values = [*HUB_NAMES, _MARK]
        elif field.type in _INTEGER_TYPES:
            values = _INTEGER_TYPES[field.type]
        for value in values:
            request = type(base)()
            request.CopyFrom(base)
            if repeated:
                getattr(request, field.name).append(value)
            else:
                setattr(request, field.name, value)
            raw = request.SerializeToString()
            if value == _MARK:
                for bad in _NOT_UTF8:
                    yield f"{field.name}={bad!r}", raw.replace(_MARK.encode(), bad)
            else:
                yield f"{field.name}={value!r}", raw


def test_every_grpc_field_refuses_bad_values_as_the_clients_mistake(
    running: RunningServer,
) -> None:
    service = pb.DESCRIPTOR.services_by_name["Inference"]
    assert set(GRPC_BASES) == {method.name for method in service.methods}
    failures = []
    metadata = (("authorization", f"Bearer {TOKEN}"),)
    with grpc.insecure_channel(running.target) as channel:
        for method in service.methods:
            path = f"/inference.v1.Inference/{method.name}"
            if method.server_streaming:
                call: Any = channel.unary_stream(path, None, None)
            else:
                call = channel.unary_unary(path, None, None)
            for where, raw in _spoiled(GRPC_BASES[method.name]):
                try:
                    answer = call(raw, timeout=60, metadata=metadata)
                    if method.server_streaming:
                        list(answer)
                except grpc.RpcError as exc:
                    if exc.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN):
                        failures.append(f"{method.name} {where}: {exc.code()} {exc.details()}")
    assert not failures, "\n".join(failures)


def test_the_walk_reaches_the_model(running: RunningServer) -> None:
    """The bases are served as they are: the walk spoils requests that would work."""
    with _http(running) as client:
        for path, (base, _) in HTTP_BASES.items():
            answer = client.post(path, json=base)
            assert answer.status_code == 200, (path, answer.text)
