"""The OpenAI-compatible port as real clients use it (issue 40): the official `openai`
SDK, litellm and langchain-openai, against a live server with the real default model.

What agent and RAG frameworks send: every optional field as null and fields the
server does not know; context overflow recognised as such (litellm's
ContextWindowExceededError, LangChain's ContextOverflowError); logit_bias; OpenAI's
error codes; CORS; /tokenize and /detokenize; completions with token-id prompts,
prompt lists and echo. Bodies, chunks and errors are validated against OpenAI's own
schemas (tests/openai_schema.py).

Offline: litellm fetches its model cost map from the network at import unless
LITELLM_LOCAL_MODEL_COST_MAP is set (the `litellm` fixture sets it), and counts tokens
with tiktoken files it ships itself (it points TIKTOKEN_CACHE_DIR at them). LangChain's
ChatOpenAI needs tiktoken only to count tokens client-side, which nothing here asks.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import grpc
import httpx2 as httpx
import openai
import pytest

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from service.config import ModelConfig
from service.models.embedded import EMBEDDED_MODELS
from tests.conftest import SMOLLM, RunningServer, make_settings, serving
from tests.openai_schema import optional_fields, validate
from tests.test_chat_template_tools import QWEN25_TEMPLATE
from tests.test_openai_http import a_slot_held

TOKEN = "s3cret"
ORIGIN = "https://app.example.com"
QUESTION: Any = [{"role": "user", "content": "What is the capital of France?"}]
AUTH = {"Authorization": f"Bearer {TOKEN}"}
WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


@pytest.fixture(scope="module")
def running() -> Iterator[RunningServer]:
    source = str(EMBEDDED_MODELS[SMOLLM].locate())
    settings = make_settings(
        http_listen="127.0.0.1:0",
        auth_token=TOKEN,
        http_cors_origins=ORIGIN,
        cached_sequences=0,  # answers compared across requests come from a fresh prefix
        models={"hermes": ModelConfig(source=source, chat_template=QWEN25_TEMPLATE)},
    )
    with serving(settings) as (server, _):
        yield server


def root(running: RunningServer) -> str:
    assert running.server.http is not None
    return f"http://127.0.0.1:{running.server.http.port}"


@pytest.fixture(scope="module")
def client(running: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=root(running) + "/v1", api_key=TOKEN, max_retries=0)


@pytest.fixture(scope="module")
def http(running: RunningServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=root(running), headers=AUTH, timeout=120) as session:
        yield session


@pytest.fixture(scope="module")
def litellm(monkeypatch_module: pytest.MonkeyPatch) -> Any:
    """litellm, imported offline (see the module docstring)."""
    monkeypatch_module.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    return litellm


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def ids_of(http: httpx.Client, text: str) -> list[int]:
    reply = http.post("/tokenize", json={"model": SMOLLM, "prompt": text})
    assert reply.status_code == 200, reply.text
    return list(reply.json()["tokens"])


def sse(reply: httpx.Response) -> list[dict[str, Any]]:
    lines = [line for line in reply.text.split("\n\n") if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[6:]) for line in lines[:-1]]


# --- tolerance ------------------------------------------------------------------------


def test_every_optional_field_as_null_and_unknown_fields_are_served(http: httpx.Client) -> None:
    nulls = {name: None for name in optional_fields("CreateChatCompletionRequest")}
    body = {
        **nulls,
        "model": SMOLLM,
        "messages": [{"role": "user", "content": "Hi", "name": None}],
        "max_tokens": 2,  # with max_completion_tokens null: issue 40's 449 tokens
        "reasoning_effort": "low",
        "x_custom_field": {"anything": True},
    }
    reply = http.post("/v1/chat/completions", json=body)
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-ignored-fields"] == "reasoning_effort, x_custom_field"
    answer = reply.json()
    validate(answer, "CreateChatCompletionResponse")
    assert answer["usage"]["completion_tokens"] == 2
    nulls = {name: None for name in optional_fields("CreateCompletionRequest")}
    completion = http.post(
        "/v1/completions", json={**nulls, "model": SMOLLM, "prompt": "Hi", "max_tokens": 2}
    )
    assert completion.status_code == 200, completion.text
    assert "x-ignored-fields" not in completion.headers
    validate(completion.json(), "CreateCompletionResponse")


def test_the_sdk_s_newer_fields_are_accepted_and_named(client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=SMOLLM,
        messages=QUESTION,
        max_completion_tokens=3,
        reasoning_effort="low",
        verbosity="low",
        prompt_cache_key="conversation-1",
        safety_identifier="user-1",
        modalities=["text"],
        store=False,
        metadata={"team": "a"},
        service_tier="auto",
        user="u",
        parallel_tool_calls=True,
        seed=1_733_356_800_123,  # a millisecond timestamp, past 32 bits
        top_p=0,  # greedy
        logit_bias={},
    )
    ignored = raw.headers["x-ignored-fields"].split(", ")
    assert ignored == sorted(
        ["metadata", "prompt_cache_key", "reasoning_effort", "safety_identifier",
         "service_tier", "store", "user", "verbosity"]
    )  # fmt: skip
    completion = raw.parse()
    greedy = client.chat.completions.create(
        model=SMOLLM, messages=QUESTION, max_completion_tokens=3, temperature=0
    )
    assert completion.choices[0].message.content == greedy.choices[0].message.content
    assert completion.choices[0].message.refusal is None


# --- errors ---------------------------------------------------------------------------


def test_context_overflow_is_the_sdk_s_context_length_exceeded(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as overflow:
        client.chat.completions.create(model=SMOLLM, messages=QUESTION, max_tokens=5000)
    assert overflow.value.code == "context_length_exceeded"
    assert overflow.value.param == "messages"
    assert "maximum context length is 1024 tokens" in overflow.value.message
    long_prompt = "word " * 1500
    with pytest.raises(openai.BadRequestError) as too_long:
        client.completions.create(model=SMOLLM, prompt=long_prompt, max_tokens=4)
    assert (too_long.value.code, too_long.value.param) == ("context_length_exceeded", "prompt")


def test_litellm_raises_its_context_window_exceeded_error(
    running: RunningServer, litellm: Any
) -> None:
    asked = {"model": f"openai/{SMOLLM}", "api_base": root(running) + "/v1", "api_key": TOKEN}
    answer = litellm.completion(**asked, messages=QUESTION, max_tokens=2)
    assert answer.usage.completion_tokens == 2  # it speaks to this server at all
    with pytest.raises(litellm.ContextWindowExceededError):
        litellm.completion(**asked, messages=QUESTION, max_tokens=5000)
    with pytest.raises(litellm.ContextWindowExceededError):
        litellm.completion(**asked, messages=[{"role": "user", "content": "word " * 1500}])


def test_langchain_raises_its_context_overflow_error(running: RunningServer) -> None:
    from langchain_core.exceptions import ContextOverflowError
    from langchain_openai import ChatOpenAI

    def chat(max_tokens: int) -> Any:
        return ChatOpenAI(
            model=SMOLLM,
            base_url=root(running) + "/v1",
            api_key=TOKEN,  # type: ignore[arg-type]
            max_retries=0,
            max_tokens=max_tokens,  # type: ignore[call-arg]
            temperature=0,
        )

    assert chat(2).invoke("Hi").usage_metadata["output_tokens"] == 2
    with pytest.raises(ContextOverflowError):
        chat(5000).invoke("Hi")
    with pytest.raises(ContextOverflowError):
        list(chat(5000).stream("Hi"))
    with pytest.raises(ContextOverflowError):
        chat(4).invoke("word " * 1500)


def test_error_codes_and_params_as_openai_s(running: RunningServer, http: httpx.Client) -> None:
    wrong_key = openai.OpenAI(base_url=root(running) + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as unauthenticated:
        wrong_key.models.list()
    assert unauthenticated.value.code == "invalid_api_key"
    missing = http.post("/v1/chat/completions", json={"model": "no-such", "messages": QUESTION})
    assert missing.status_code == 404
    assert (missing.json()["error"]["code"], missing.json()["error"]["param"]) == (
        "model_not_found",
        "model",
    )
    bad = http.post("/v1/chat/completions", json={"messages": QUESTION, "temperature": 7})
    assert (bad.status_code, bad.json()["error"]["param"]) == (400, None)  # the contract's
    typed = http.post("/v1/chat/completions", json={"messages": QUESTION, "temperature": "hot"})
    assert typed.json()["error"]["param"] == "temperature"
    for reply in (missing, bad, typed):
        validate(reply.json(), "ErrorResponse")
        assert "Retry-After" not in reply.headers


def test_a_rate_limited_request_is_429_rate_limit_exceeded_with_retry_after() -> None:
    settings = make_settings(http_listen="127.0.0.1:0", max_concurrent=1, max_queue=0)
    with (
        serving(settings) as (running, _),
        httpx.Client(base_url=root(running)) as http,
        a_slot_held(running),
    ):
        body = {"model": SMOLLM, "messages": QUESTION, "max_tokens": 4}
        refused = http.post("/v1/chat/completions", json=body, timeout=120)
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        assert int(refused.headers["Retry-After"]) >= 1
        validate(refused.json(), "ErrorResponse")
        # No CORS setting here: a preflight is no request this server serves.
        preflight = http.options(
            "/v1/chat/completions",
            headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST"},
        )
        assert preflight.status_code == 405
        assert "Access-Control-Allow-Origin" not in preflight.headers


def test_n_up_to_what_the_gate_holds(http: httpx.Client) -> None:
    body = {"model": SMOLLM, "messages": QUESTION, "max_tokens": 1, "temperature": 0}
    many = http.post("/v1/chat/completions", json={**body, "n": 40})
    assert many.status_code == 200, many.text
    assert [choice["index"] for choice in many.json()["choices"]] == list(range(40))
    # 128 is OpenAI's bound; this server holds 24 running and 96 waiting of one model.
    refused = http.post("/v1/chat/completions", json={**body, "n": 128})
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "n"
    assert "at most 120" in refused.json()["error"]["message"]


def test_completion_ids_are_the_server_s_and_the_request_id_stays_a_header(
    http: httpx.Client,
) -> None:
    body = {"model": SMOLLM, "messages": QUESTION, "max_tokens": 1}
    replies = [
        http.post("/v1/chat/completions", json=body, headers={"x-request-id": "same-id"})
        for _ in range(2)
    ]
    assert [reply.headers["x-request-id"] for reply in replies] == ["same-id", "same-id"]
    ids = [reply.json()["id"] for reply in replies]
    assert ids[0] != ids[1]
    assert all(i.startswith("chatcmpl-") and "same-id" not in i for i in ids)


# --- logit_bias -------------------------------------------------------------------------


def test_logit_bias_makes_a_token_certain(client: openai.OpenAI, http: httpx.Client) -> None:
    (token,) = ids_of(http, " banana")
    for seed in (1, 2):
        completion = client.completions.create(
            model=SMOLLM,
            prompt="My favourite colour is",
            max_tokens=4,
            temperature=1.0,
            seed=seed,
            logit_bias={str(token): 100},
        )
        assert completion.choices[0].text == " banana" * 4


def test_logit_bias_makes_a_token_impossible(client: openai.OpenAI, http: httpx.Client) -> None:
    def answer(**fields: Any) -> str:
        completion = client.completions.create(
            model=SMOLLM, prompt="The capital of France is", max_tokens=12, **fields
        )
        return str(completion.choices[0].text)

    sampled = {"temperature": 0.7, "seed": 5}
    assert "Paris" in answer(temperature=0)
    assert "Paris" in answer(**sampled)
    banned = {str(token): -100 for text in (" Paris", "Paris") for token in ids_of(http, text)}
    assert "Paris" not in answer(temperature=0, logit_bias=banned)
    assert "Paris" not in answer(**sampled, logit_bias=banned)


def test_a_logit_bias_outside_the_vocabulary_is_refused_naming_the_id(
    client: openai.OpenAI,
) -> None:
    with pytest.raises(openai.BadRequestError, match="token id 999999") as refused:
        client.chat.completions.create(
            model=SMOLLM, messages=QUESTION, max_tokens=2, logit_bias={"999999": 5}
        )
    assert refused.value.param == "logit_bias"
    with pytest.raises(openai.BadRequestError, match=r"\[-100, 100\]"):
        client.chat.completions.create(
            model=SMOLLM, messages=QUESTION, max_tokens=2, logit_bias={"5": 150}
        )


# --- CORS ------------------------------------------------------------------------------


def test_cors_preflight_and_headers_on_answers_errors_and_streams(running: RunningServer) -> None:
    with httpx.Client(base_url=root(running), timeout=120) as browser:
        preflight = browser.options(
            "/v1/chat/completions",
            headers={
                "Origin": ORIGIN,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os",
            },
        )
        assert preflight.status_code == 204  # no token: a browser sends none with it
        assert preflight.headers["Access-Control-Allow-Origin"] == ORIGIN
        assert "POST" in preflight.headers["Access-Control-Allow-Methods"]
        assert "x-stainless-os" in preflight.headers["Access-Control-Allow-Headers"]
        stranger = browser.options(
            "/v1/chat/completions",
            headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"},
        )
        assert stranger.status_code == 403
        assert "Access-Control-Allow-Origin" not in stranger.headers
        body = {"model": SMOLLM, "messages": QUESTION, "max_tokens": 2}
        headers = {**AUTH, "Origin": ORIGIN}
        for reply in (
            browser.post("/v1/chat/completions", json=body, headers=headers),
            browser.post("/v1/chat/completions", json={**body, "stream": True}, headers=headers),
            browser.post("/v1/chat/completions", json=body, headers={"Origin": ORIGIN}),  # 401
            browser.get("/v1/nothing", headers=headers),  # 404
        ):
            assert reply.headers["Access-Control-Allow-Origin"] == ORIGIN, reply.status_code
            assert "x-request-id" in reply.headers["Access-Control-Expose-Headers"]
        plain = browser.post("/v1/chat/completions", json=body, headers=AUTH)
        assert "Access-Control-Allow-Origin" not in plain.headers


# --- tokenize / detokenize ------------------------------------------------------------


def test_tokenize_and_detokenize_round_trip(client: openai.OpenAI, http: httpx.Client) -> None:
    text = "The quick brown fox jumps over the lazy dog. Ünïcödé, 東京."
    tokenized = http.post("/tokenize", json={"model": SMOLLM, "prompt": text}).json()
    assert tokenized["count"] == len(tokenized["tokens"]) > 5
    assert tokenized["max_model_len"] == 1024
    back = http.post("/detokenize", json={"model": SMOLLM, "tokens": tokenized["tokens"]})
    assert back.json() == {"prompt": text}
    # A chat's tokens are those its generation reads: the template and the turns.
    chat = http.post("/tokenize", json={"model": SMOLLM, "messages": QUESTION}).json()
    completion = client.chat.completions.create(model=SMOLLM, messages=QUESTION, max_tokens=1)
    assert completion.usage is not None
    assert chat["count"] == completion.usage.prompt_tokens
    rendered = http.post("/detokenize", json={"tokens": chat["tokens"]}).json()["prompt"]
    assert "<|im_start|>user\nWhat is the capital of France?<|im_end|>" in rendered
    outside = http.post("/detokenize", json={"tokens": [1, 10**9]})
    assert outside.status_code == 400
    assert outside.json()["error"]["param"] == "tokens"
    assert "1000000000" in outside.json()["error"]["message"]


def test_tokenize_and_detokenize_over_grpc(running: RunningServer) -> None:
    metadata = (("authorization", f"Bearer {TOKEN}"),)
    with grpc.insecure_channel(running.target) as channel:
        stub = pb_grpc.InferenceStub(channel)
        tokenized = stub.Tokenize(pb.TokenizeRequest(prompt="Hello there"), metadata=metadata)
        assert tokenized.model == SMOLLM
        assert tokenized.context_length == 1024
        text = stub.Detokenize(
            pb.DetokenizeRequest(token_ids=tokenized.token_ids), metadata=metadata
        ).text
        assert text == "Hello there"
        # Generate fed the same ids as a prompt of token ids writes the same text.
        by_text = pb.GenerateRequest(prompt="Hello there", max_tokens=6, temperature=0)
        by_ids = pb.GenerateRequest(
            prompt_token_ids=tokenized.token_ids, max_tokens=6, temperature=0
        )
        texts = [
            "".join(e.delta.text for e in stub.Generate(r, metadata=metadata))
            for r in (by_text, by_ids)
        ]
        assert texts[0] == texts[1] != ""
        with pytest.raises(grpc.RpcError) as outside:
            stub.Detokenize(pb.DetokenizeRequest(token_ids=[7, 50000]), metadata=metadata)
        assert outside.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "50000" in (outside.value.details() or "")


# --- completions: prompt forms and echo ------------------------------------------------


def test_completions_of_token_ids_prompt_lists_and_echo(
    client: openai.OpenAI, http: httpx.Client
) -> None:
    def complete(prompt: Any, **fields: Any) -> Any:
        answer = client.completions.create(
            model=SMOLLM, prompt=prompt, max_tokens=4, temperature=0, **fields
        )
        validate(answer.model_dump(exclude_unset=True), "CreateCompletionResponse")
        return answer

    first, second = "The capital of France is", "One, two, three,"
    alone = [complete(p).choices[0].text for p in (first, second)]
    ids = ids_of(http, first)
    assert complete(ids).choices[0].text == alone[0]
    listed = complete([first, ids_of(http, second)], n=2)
    assert [c.index for c in listed.choices] == [0, 1, 2, 3]  # each prompt's n in turn
    assert [c.text for c in listed.choices] == [alone[0], alone[0], alone[1], alone[1]]
    assert listed.usage.prompt_tokens == len(ids) + len(ids_of(http, second))
    assert listed.usage.completion_tokens == 4 * 4
    echoed = complete([first, ids], echo=True)
    assert [c.text for c in echoed.choices] == [first + alone[0]] * 2
    stream = client.completions.create(
        model=SMOLLM, prompt=first, max_tokens=4, temperature=0, echo=True, stream=True
    )
    pieces = [chunk.choices[0].text for chunk in stream]
    assert pieces[0] == first  # the prompt comes first
    assert "".join(pieces) == first + alone[0]
    with pytest.raises(openai.BadRequestError, match="echo") as refused:
        complete(first, echo=True, logprobs=1)
    assert refused.value.param == "echo"


# --- shapes ----------------------------------------------------------------------------


def test_chat_answers_and_chunks_validate_against_openai_s_schemas(http: httpx.Client) -> None:
    body = {
        "model": SMOLLM,
        "messages": QUESTION,
        "max_tokens": 4,
        "logprobs": True,
        "top_logprobs": 2,
    }
    whole = http.post("/v1/chat/completions", json=body).json()
    validate(whole, "CreateChatCompletionResponse")
    assert whole["choices"][0]["logprobs"]["refusal"] is None
    streamed = http.post(
        "/v1/chat/completions",
        json={**body, "stream": True, "stream_options": {"include_usage": True}},
    )
    chunks = sse(streamed)
    for chunk in chunks:
        validate(chunk, "CreateChatCompletionStreamResponse")
    assert chunks[-1]["usage"]["completion_tokens"] == 4
    assert len({chunk["id"] for chunk in chunks}) == 1


# --- a forced call cut short -----------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_forced_parallel_call_cut_by_max_tokens_leaks_no_markup(
    http: httpx.Client, stream: bool
) -> None:
    """Issue 40: allowed several calls, the model writes one and begins another; cut
    there, the half-written block was left in `content`."""
    body: dict[str, Any] = {
        "model": "hermes",
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": [WEATHER],
        "tool_choice": "required",
        "temperature": 0,
    }
    one = http.post("/v1/chat/completions", json=body).json()
    assert one["choices"][0]["finish_reason"] == "tool_calls"
    call_tokens = one["usage"]["completion_tokens"]
    cut = {**body, "parallel_tool_calls": True, "max_tokens": call_tokens + 8, "stream": stream}
    reply = http.post("/v1/chat/completions", json=cut)
    assert reply.status_code == 200, reply.text
    if stream:
        chunks = sse(reply)
        for chunk in chunks:
            validate(chunk, "CreateChatCompletionStreamResponse")
        deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
        content = "".join(delta.get("content") or "" for delta in deltas)
        calls = [call for delta in deltas for call in delta.get("tool_calls") or []]
        finish = chunks[-1]["choices"][0]["finish_reason"]
    else:
        answer = reply.json()
        validate(answer, "CreateChatCompletionResponse")
        message = answer["choices"][0]["message"]
        content = message["content"] or ""
        calls = message.get("tool_calls") or []
        finish = answer["choices"][0]["finish_reason"]
    assert finish == "length"
    assert content == ""
    assert [call["function"]["name"] for call in calls] == ["get_weather"]
