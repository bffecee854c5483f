"""The OpenAI-compatible HTTP surface (issue 30), with the official `openai` SDK as the client.

One server, with `--http-listen` on a free port: SmolLM2 (its own chat template)
as the default, and SmolLM2 under a Hermes-style template as "hermes" for tool
calls. Everything here goes over real HTTP to the same process that serves gRPC.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import jsonschema
import openai
import pytest

from service.config import ModelConfig
from service.errors import InvalidRequest
from service.front.conversion import generation_request
from service.front.openai_api.requests import chat_request, parse_body
from service.models.embedded import EMBEDDED_MODELS
from tests.certificates import make_pki
from tests.conftest import SMOLLM, RunningServer, make_settings, serving
from tests.test_chat_template_tools import QWEN25_TEMPLATE
from tests.test_generation_features import CALL_GRAMMAR, PERSON

WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
QUESTION: Any = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def running() -> Iterator[RunningServer]:
    source = str(EMBEDDED_MODELS[SMOLLM].locate())
    models = {"hermes": ModelConfig(source=source, chat_template=QWEN25_TEMPLATE)}
    # No prompt cache: the tests compare answers to one prompt, and greedy text from a
    # cached prefix may part from a fresh one at a near-tie (docs/api.md, "What a seed
    # guarantees").
    settings = make_settings(models=models, http_listen="127.0.0.1:0", cached_sequences=0)
    with serving(settings) as (server, _):
        yield server


def base_url(running: RunningServer) -> str:
    assert running.server.http is not None
    return f"http://127.0.0.1:{running.server.http.port}/v1"


@pytest.fixture(scope="module")
def client(running: RunningServer) -> openai.OpenAI:
    # No retries: a refusal must reach the test as the SDK's own exception.
    return openai.OpenAI(base_url=base_url(running), api_key="none", max_retries=0)


def chat(client: openai.OpenAI, **fields: Any) -> Any:
    """A chat completion, the SDK's typed parameters taken as given."""
    return client.chat.completions.create(**fields)


def test_a_chat_completion_answers_with_usage_and_the_request_id(client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=SMOLLM,
        messages=QUESTION,
        max_tokens=12,
        temperature=0,
        extra_headers={"x-request-id": "http-chat-1"},
    )
    assert raw.headers["x-request-id"] == "http-chat-1"
    completion = raw.parse()
    assert completion.id.startswith("chatcmpl-")  # the server's own: the header has the request's
    assert "http-chat-1" not in completion.id
    (choice,) = completion.choices
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert choice.finish_reason in ("stop", "length")
    usage = completion.usage
    assert usage is not None
    assert usage.prompt_tokens > 5
    assert 0 < usage.completion_tokens <= 12
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_a_streamed_chat_gives_the_same_text_and_usage_last(client: openai.OpenAI) -> None:
    whole = chat(
        client,
        model=SMOLLM,
        messages=QUESTION,
        max_tokens=16,
        temperature=0,
        seed=3,
    )
    chunks = list(
        chat(
            client,
            model=SMOLLM,
            messages=QUESTION,
            max_tokens=16,
            temperature=0,
            seed=3,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishing = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert [c.choices[0].finish_reason for c in finishing] == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == []  # the usage chunk comes last, with no choice
    assert chunks[-1].usage is not None
    assert whole.usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_stop_ends_the_text_before_the_stop_sequence(client: openai.OpenAI) -> None:
    free = chat(
        client,
        model=SMOLLM,
        messages=QUESTION,
        max_tokens=24,
        temperature=0,
    ).choices[0]
    text = free.message.content or ""
    words = text.split()
    assert len(words) >= 3, text
    stop = words[2]
    stopped = chat(
        client,
        model=SMOLLM,
        messages=QUESTION,
        max_tokens=24,
        temperature=0,
        stop=[stop],
    ).choices[0]
    assert stopped.finish_reason == "stop"
    assert stopped.message.content == text[: text.index(stop)]


def test_the_same_seed_gives_the_same_sampled_text(client: openai.OpenAI) -> None:
    def sampled(seed: int) -> str:
        return (
            chat(
                client,
                model=SMOLLM,
                messages=QUESTION,
                max_tokens=16,
                temperature=1.0,
                seed=seed,
            )
            .choices[0]
            .message.content
            or ""
        )

    assert sampled(11) == sampled(11)


def test_logprobs_come_per_token_with_their_alternatives(client: openai.OpenAI) -> None:
    completion = chat(
        client,
        model=SMOLLM,
        messages=QUESTION,
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    choice = completion.choices[0]
    assert choice.logprobs is not None
    content = choice.logprobs.content
    assert content is not None
    assert completion.usage is not None
    assert len(content) == completion.usage.completion_tokens
    for entry in content:
        assert entry.logprob <= 0
        assert len(entry.top_logprobs) == 3
        ranked = [top.logprob for top in entry.top_logprobs]
        assert ranked == sorted(ranked, reverse=True)
        assert entry.logprob >= ranked[-1] - 1e-4  # greedy: the chosen one is among the best
    assert "".join(entry.token for entry in content) == choice.message.content


def test_a_json_schema_response_format_gives_json_that_validates(client: openai.OpenAI) -> None:
    completion = chat(
        client,
        model=SMOLLM,
        messages=[{"role": "user", "content": "Describe a person as JSON."}],
        max_tokens=60,
        temperature=0,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": PERSON},
        },
    )
    jsonschema.validate(json.loads(completion.choices[0].message.content or ""), PERSON)


def test_a_tool_call_round_trip(client: openai.OpenAI) -> None:
    question = {"role": "user", "content": "What is the weather in Paris?"}
    first = chat(
        client,
        model="hermes",
        messages=[question],
        tools=[WEATHER],
        temperature=0,
        extra_body={"grammar": CALL_GRAMMAR},  # llama-server's extension: forces the call
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"].isalpha()
    result = {"role": "tool", "tool_call_id": call.id, "content": '{"celsius": 21}'}
    second = chat(
        client,
        model="hermes",
        messages=[question, choice.message.model_dump(exclude_none=True), result],
        tools=[WEATHER],
        temperature=0,
        max_tokens=8,
    )
    assert first.usage is not None
    assert second.usage is not None
    # The call and its result went back through the template: the prompt grew by them.
    assert second.usage.prompt_tokens > first.usage.prompt_tokens + 10


def streamed_weather_call(client: openai.OpenAI, grammar: str) -> list[Any]:
    """The chunks of a streamed answer with the weather tool, `grammar` forcing its text."""
    return list(
        chat(
            client,
            model="hermes",
            messages=[{"role": "user", "content": "Weather in Rome?"}],
            tools=[WEATHER],
            temperature=0,
            stream=True,
            extra_body={"grammar": grammar},
        )
    )


def test_a_streamed_tool_call_arrives_as_tool_call_deltas(client: openai.OpenAI) -> None:
    chunks = streamed_weather_call(client, CALL_GRAMMAR)
    calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert [tc.function.name for tc in calls] == ["get_weather"]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert not any("<tool_call>" in (c.choices[0].delta.content or "") for c in chunks)


def test_with_tools_text_before_a_call_streams_as_it_comes(client: openai.OpenAI) -> None:
    """Only text that cannot belong to a call block is held back (it used to be all of it,
    sent in one piece at the end)."""
    said = "Let me check the weather in Rome for you."
    grammar = CALL_GRAMMAR.replace('root ::= "<tool_call>', f'root ::= "{said} <tool_call>')
    chunks = streamed_weather_call(client, grammar)
    texts = [c.choices[0].delta.content for c in chunks if c.choices]
    before_end = [text for text in texts[:-2] if text]  # the last two: the calls, the end
    assert len(before_end) > 3  # many pieces, as the tokens came
    assert "".join(before_end) == said
    calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert [tc.function.name for tc in calls] == ["get_weather"]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert not any("tool_call" in (text or "") for text in texts)


CLOCK: Any = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"enum": ["UTC", "CET"]}},
            "required": ["zone"],
        },
    },
}


def test_tool_choice_required_makes_the_model_call_a_tool(client: openai.OpenAI) -> None:
    completion = chat(
        client,
        model="hermes",
        messages=QUESTION,  # a question no tool answers
        tools=[WEATHER],
        tool_choice="required",
        temperature=0,
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])


def test_tool_choice_naming_a_function_streams_a_call_of_it(client: openai.OpenAI) -> None:
    chunks = list(
        chat(
            client,
            model="hermes",
            messages=[{"role": "user", "content": "Weather in Rome?"}],
            tools=[WEATHER, CLOCK],
            tool_choice={"type": "function", "function": {"name": "get_time"}},
            temperature=0,
            stream=True,
        )
    )
    calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert [tc.function.name for tc in calls if tc.function and tc.function.name] == ["get_time"]
    arguments = "".join(tc.function.arguments or "" for tc in calls if tc.function)
    jsonschema.validate(json.loads(arguments), CLOCK["function"]["parameters"])
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_a_tool_choice_that_cannot_be_met_is_a_400(client: openai.OpenAI) -> None:
    named = {"type": "function", "function": {"name": "get_news"}}
    with pytest.raises(openai.BadRequestError, match="not one of"):
        chat(client, model="hermes", messages=QUESTION, tools=[WEATHER], tool_choice=named)
    with pytest.raises(openai.BadRequestError, match="tool_choice"):
        chat(client, model="hermes", messages=QUESTION, tools=[WEATHER], tool_choice="always")


def test_text_completions_and_the_model_list(client: openai.OpenAI) -> None:
    completion = client.completions.create(
        model=SMOLLM, prompt="The capital of France is", max_tokens=5, temperature=0
    )
    assert completion.object == "text_completion"
    assert completion.choices[0].text
    assert completion.usage is not None
    assert completion.usage.completion_tokens <= 5
    names = {model.id for model in client.models.list()}
    assert {SMOLLM, "hermes"} <= names
    assert client.models.retrieve("hermes").id == "hermes"
    with pytest.raises(openai.NotFoundError, match="GET /v1/models lists them"):
        client.models.retrieve("org/no-such-model")


def test_health_answers_probes_without_a_token_and_unserved_paths_are_json() -> None:
    settings = make_settings(http_listen="127.0.0.1:0", auth_token="secret")
    with serving(settings) as (running, _):
        root = base_url(running).removesuffix("/v1")
        health = httpx.get(root + "/health")
        assert (health.status_code, health.json()) == (200, {"status": "ok"})
        unknown = httpx.post(root + "/v1/audio/speech", json={})
        assert unknown.status_code == 404
        assert "does not serve POST '/v1/audio/speech'" in unknown.json()["error"]["message"]
        wrong_method = httpx.get(root + "/v1/chat/completions")
        assert wrong_method.status_code == 405
        assert wrong_method.headers["Allow"] == "POST"
        assert "takes POST" in wrong_method.json()["error"]["message"]


STORY: Any = [{"role": "user", "content": "Tell me a long story about a dragon."}]


def test_n_choices_each_draw_with_a_seed_of_their_own(client: openai.OpenAI) -> None:
    answer = chat(
        client, model=SMOLLM, messages=STORY, n=3, seed=11, temperature=1.0, max_tokens=16
    )
    assert [choice.index for choice in answer.choices] == [0, 1, 2]
    texts = [choice.message.content for choice in answer.choices]
    assert all(texts)
    assert len(set(texts)) > 1  # seeds 11, 12 and 13: not one draw three times


def test_n_choices_count_the_prompt_once_and_every_completion(client: openai.OpenAI) -> None:
    one = chat(client, model=SMOLLM, messages=STORY, temperature=0, max_tokens=8)
    three = chat(client, model=SMOLLM, messages=STORY, n=3, temperature=0, max_tokens=8)
    assert one.choices[0].finish_reason == "length"  # a story does not end in 8 tokens
    assert three.usage.prompt_tokens == one.usage.prompt_tokens
    assert three.usage.completion_tokens == 3 * 8


def test_n_choices_stream_interleaved_each_to_its_end(client: openai.OpenAI) -> None:
    stream = chat(
        client, model=SMOLLM, messages=STORY, n=2, max_tokens=8, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    text = {0: "", 1: ""}
    finishes: dict[int, str] = {}
    usage = None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            text[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
    assert finishes == {0: "length", 1: "length"}
    assert all(text.values())
    assert usage is not None
    assert usage.completion_tokens == 2 * 8


@contextlib.contextmanager
def a_slot_held(running: RunningServer, model: str = SMOLLM) -> Iterator[None]:
    """One of the gate's slots for `model`, taken as a request would and held meanwhile."""
    loop = running._loop
    held, release = threading.Event(), asyncio.Event()

    async def hold() -> None:
        async with running.server.gate.slot(model):
            held.set()
            await release.wait()

    holding = asyncio.run_coroutine_threadsafe(hold(), loop)
    assert held.wait(60)
    try:
        yield
    finally:
        loop.call_soon_threadsafe(release.set)
        holding.result(60)


def test_a_choice_the_gate_refuses_ends_the_request_and_frees_the_others() -> None:
    # Two slots and no queue: `n: 2` fits the gate, unless a slot is taken.
    settings = make_settings(http_listen="127.0.0.1:0", max_concurrent=2, max_queue=0)
    with serving(settings) as (running, _), a_slot_held(running):
        alone = openai.OpenAI(base_url=base_url(running), api_key="none", max_retries=0)
        with pytest.raises(openai.RateLimitError):
            chat(alone, model=SMOLLM, messages=STORY, n=2, max_tokens=64)
        # The choice that had the slot was cancelled with the request: the slot is free.
        answer = chat(alone, model=SMOLLM, messages=STORY, max_tokens=4)
        assert answer.usage.completion_tokens == 4


def test_errors_are_the_sdk_s_own_exceptions(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        chat(client, model="no-such-model", messages=QUESTION)
    assert "no-such-model" in str(missing.value)
    with pytest.raises(openai.BadRequestError, match="`n` must be an integer from 1 to 128"):
        chat(client, model=SMOLLM, messages=QUESTION, n=129)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        chat(client, model=SMOLLM, messages=QUESTION, temperature=-3)
    with pytest.raises(openai.BadRequestError, match="messages"):
        chat(client, model=SMOLLM, messages=[])


HUGE_NUMBER = "1" * 5000  # past the 4,300 digits Python reads as an int
HOSTILE_BODIES = {
    "nested without end": '{"messages": ' + "[" * 100_000 + "]" * 100_000 + "}",
    "nested past the bound": '{"messages": [{"role": "user", "content": "hi"}], "metadata": '
    + '{"a": ' * 80
    + "1"
    + "}" * 81,
    "a number too long to read": '{"messages": [], "max_tokens": ' + HUGE_NUMBER + "}",
    "a number past any float": '{"messages": [{"role": "user", "content": "hi"}], '
    '"temperature": 1' + "0" * 400 + "}",
    "stream as a string, which is truthy": '{"messages": [{"role": "user", "content": "hi"}], '
    '"stream": "false"}',
    "tool calls that are not a list": '{"messages": [{"role": "assistant", "tool_calls": 5}]}',
    "a json_schema that is not an object": '{"messages": [{"role": "user", "content": "hi"}], '
    '"response_format": {"type": "json_schema", "json_schema": "person"}}',
    "call arguments too long to read": '{"messages": [{"role": "assistant", "tool_calls": '
    '[{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{\\"n\\": '
    + HUGE_NUMBER
    + '}"}}]}, {"role": "user", "content": "hi"}]}',
}


@pytest.mark.parametrize("body", HOSTILE_BODIES.values(), ids=HOSTILE_BODIES.keys())
def test_a_hostile_body_is_refused_as_an_invalid_request(body: str) -> None:
    """Without a server: the body's translation and conversion refuse it, as the port
    does before anything reaches a model."""
    with pytest.raises(InvalidRequest):
        generation_request(chat_request(parse_body(body.encode())))


def test_hostile_bodies_are_400s_and_the_server_serves_on(
    running: RunningServer, client: openai.OpenAI
) -> None:
    for name, body in HOSTILE_BODIES.items():
        reply = httpx.post(
            base_url(running) + "/chat/completions",
            content=body.encode(),
            headers={"content-type": "application/json"},
        )
        assert reply.status_code == 400, (name, reply.text)
        assert reply.json()["error"]["type"] == "invalid_request_error", name
    answer = chat(client, model=SMOLLM, messages=QUESTION, max_tokens=2)
    assert answer.usage.completion_tokens == 2


def test_a_body_too_large_is_413_in_openai_s_error_shape(running: RunningServer) -> None:
    size = int(running.server.settings.max_receive_message_bytes) + 1
    reply = httpx.post(
        base_url(running) + "/chat/completions",
        content=b'{"messages": "' + b"x" * size + b'"}',
        headers={"content-type": "application/json"},
    )
    assert reply.status_code == 413
    assert reply.json()["error"]["message"]


def test_a_bearer_token_is_required_when_the_server_has_one() -> None:
    settings = make_settings(http_listen="127.0.0.1:0", auth_token="s3cret")
    with serving(settings) as (server, _):
        url = base_url(server)
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url, api_key="wrong", max_retries=0).models.list()
        names = [m.id for m in openai.OpenAI(base_url=url, api_key="s3cret").models.list()]
        assert SMOLLM in names


def test_a_client_that_disconnects_cancels_its_generation(running: RunningServer) -> None:
    body = {"model": SMOLLM, "messages": QUESTION, "max_tokens": 900, "stream": True}
    gate = running.server.gate
    with (
        httpx.Client() as http,
        http.stream("POST", base_url(running) + "/chat/completions", json=body) as reply,
    ):
        lines = reply.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        assert gate.active == 1  # it holds its slot while it generates
    # The connection closed after one chunk: the generation stops, its slot frees,
    # and the request is counted as cancelled, not as one that ran to its end.
    deadline = time.monotonic() + 30
    while gate.active and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gate.active == 0
    labels = {"rpc": "ChatCompletions", "model": SMOLLM, "code": "CANCELLED"}
    registry = running.server.metrics.registry
    assert registry.get_sample_value("inference_rpcs_total", labels) == 1


SSE = re.compile(rb"(data: \{[^\n]*\}\n\n)+data: \[DONE\]\n\n")


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_sees_server_sent_events_framed_byte_for_byte(running: RunningServer) -> None:
    body = json.dumps({"model": SMOLLM, "messages": QUESTION, "max_tokens": 5, "stream": True})
    output = subprocess.run(
        ["curl", "-sN", "-H", "content-type: application/json", "-d", body,
         base_url(running) + "/chat/completions"],
        capture_output=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    assert SSE.fullmatch(output), output[:500]
    events = [json.loads(part[6:]) for part in output.split(b"\n\n")[:-2]]
    assert all(event["object"] == "chat.completion.chunk" for event in events)
    assert events[-1]["choices"][0]["finish_reason"] in ("stop", "length")


def test_tls_serves_https_with_the_grpc_port_s_certificate(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    settings = make_settings(
        http_listen="127.0.0.1:0", tls_cert=pki.server.cert, tls_key=pki.server.key
    )
    with serving(settings) as (server, _):
        assert server.server.http is not None
        url = f"https://localhost:{server.server.http.port}/v1"
        verify = ssl.create_default_context(cafile=str(pki.ca.cert))
        with httpx.Client(verify=verify) as trusting:
            client = openai.OpenAI(
                base_url=url, api_key="none", http_client=trusting, max_retries=0
            )
            assert SMOLLM in {model.id for model in client.models.list()}
        with pytest.raises(httpx.RemoteProtocolError):  # no plaintext HTTP there
            httpx.get(url.replace("https", "http") + "/models")


def test_draining_refuses_new_requests_and_lets_a_running_stream_finish() -> None:
    running = RunningServer(make_settings(http_listen="127.0.0.1:0"))
    url = base_url(running) + "/chat/completions"
    body = {"model": SMOLLM, "messages": QUESTION, "max_tokens": 40, "stream": True}
    with httpx.Client(timeout=120) as http, http.stream("POST", url, json=body) as reply:
        lines = reply.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        stopping = asyncio.run_coroutine_threadsafe(running.server.stop(grace=60), running._loop)
        deadline = time.monotonic() + 30
        while not running.server.http._draining and time.monotonic() < deadline:  # type: ignore[union-attr]
            time.sleep(0.01)
        refused = http.post(url, json={**body, "stream": False})
        assert refused.status_code == 503
        assert "draining" in refused.json()["error"]["message"]
        assert refused.headers["Retry-After"] == "1"  # elsewhere, through a proxy
        health = http.get(url.removesuffix("/v1/chat/completions") + "/health")
        assert (health.status_code, health.json()) == (503, {"status": "unavailable"})
        rest = list(lines)  # the stream in flight runs to its end
    assert rest[-2:] == ["data: [DONE]", ""] or rest[-1] == "data: [DONE]"
    stopping.result(timeout=60)
    running._end_loop()  # stopped above, with a grace; its loop closed, not left to the collector


def test_choices_past_the_parallel_sequences_run_in_turn_each_within_its_ceiling() -> None:
    """`n` above --parallel-sequences: the choices past it wait for a seat and each runs
    whole; the decode ceiling counts from a choice's own start, not the request's, so a
    request whose choices together take longer than the ceiling still gets all of them."""
    ceiling = 3.0
    settings = make_settings(
        http_listen="127.0.0.1:0", parallel_sequences=1, max_decode_seconds=ceiling
    )
    with serving(settings) as (server, _):
        reply = httpx.post(
            base_url(server) + "/completions",
            # Greedy: a sampled choice may draw the end of its turn before 32 tokens
            # (seen once in CI), which says nothing of seats or ceilings.
            json={"prompt": "Once upon a time", "max_tokens": 32, "n": 24, "temperature": 0},
            timeout=300,
        )
    assert reply.status_code == 200, reply.text
    choices = reply.json()["choices"]
    assert sorted(choice["index"] for choice in choices) == list(range(24))
    reasons = [choice["finish_reason"] for choice in choices]
    assert reasons == ["length"] * 24, reasons
    assert reply.json()["usage"]["completion_tokens"] == 24 * 32
