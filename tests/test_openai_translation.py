"""The OpenAI-compatible port's translations, without a server (issue 40).

Request bodies to the contract's requests (nulls, ignored and refused fields,
seeds, logit_bias, prompt forms), the service's errors to OpenAI's codes, the
answers' shapes against OpenAI's own schemas, and the CORS setting.
"""

from __future__ import annotations

from typing import Any

import grpc
import jsonschema
import pytest

from inference.v1 import inference_pb2 as pb
from service.config import Settings, cors_origins
from service.engine import wire
from service.errors import (
    ContextOverflow,
    InvalidRequest,
    ModelNotFound,
    NotSupported,
    Overloaded,
    ServiceError,
    Unauthenticated,
    Unavailable,
)
from service.front.openai_api.errors import described
from service.front.openai_api.requests import (
    IGNORED,
    chat_request,
    choice_count,
    completion_requests,
    ignored_fields,
    parse_body,
)
from service.front.openai_api.responses import Reply, completion_id, usage_of, whole_of
from service.front.openai_api.tokens import detokenize_request, tokenize_request
from service.text.requests import GenerationRequest
from tests.openai_schema import optional_fields, validate

HI: Any = [{"role": "user", "content": "Hi"}]


def test_every_optional_chat_field_as_null_is_absent() -> None:
    fields = optional_fields("CreateChatCompletionRequest")
    assert {"logit_bias", "reasoning_effort", "verbosity", "modalities", "audio"} <= set(fields)
    body = parse_body(
        b'{"model": "m", "messages": [{"role": "user", "content": "Hi", "name": null}], '
        + b", ".join(f'"{name}": null'.encode() for name in fields if name != "model")
        + b"}"
    )
    assert chat_request(body) == chat_request({"model": "m", "messages": HI})
    assert ignored_fields(body, chat=True) == []  # a null is no field, so none is ignored


def test_every_optional_completion_field_as_null_is_absent() -> None:
    fields = optional_fields("CreateCompletionRequest")
    body = parse_body(
        b'{"model": "m", "prompt": "Hi", '
        + b", ".join(f'"{name}": null'.encode() for name in fields if name != "prompt")
        + b"}"
    )
    assert completion_requests(body) == [pb.GenerateRequest(model="m", prompt="Hi")]


def test_a_null_max_completion_tokens_leaves_max_tokens_in_force() -> None:
    """Issue 40's bug: the null was read as the limit, and 449 tokens came back."""
    body = parse_body(b'{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, '
                      b'"max_completion_tokens": null}')  # fmt: skip
    assert chat_request(body).max_tokens == 2
    both = {"messages": HI, "max_tokens": 2, "max_completion_tokens": 5}
    assert chat_request(both).max_tokens == 5  # the newer name wins


def test_nulls_inside_a_client_s_own_json_are_kept() -> None:
    body = parse_body(
        b'{"messages": [{"role": "user", "content": "Hi"}], "tools": [{"type": "function", '
        b'"function": {"name": "f", "description": null, "parameters": '
        b'{"type": "object", "properties": {"x": {"default": null}}}}}]}'
    )
    (tool,) = chat_request(body).tools
    assert tool.description == ""
    assert '"default": null' in tool.parameters_json
    assert tool.parameters_json.startswith('{"type": "object"')


def test_unknown_and_unused_fields_are_accepted_and_named() -> None:
    body = {"messages": HI, "reasoning_effort": "low", "user": "u", "x_custom": 1, "stream": False}
    assert chat_request(body) == chat_request({"messages": HI})
    assert ignored_fields(body, chat=True) == ["reasoning_effort", "user", "x_custom"]
    for name in IGNORED:  # OpenAI's fields with no meaning here: each accepted
        chat_request({"messages": HI, name: "anything"})
    assert ignored_fields({"prompt": "p", "messages": HI}, chat=False) == ["messages"]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"audio": {"voice": "alloy", "format": "mp3"}}, "audio"),
        ({"n": 129}, "n"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"logit_bias": [1]}, "logit_bias"),
        ({"seed": 1 << 63}, "seed"),
        ({"stop": 3}, "stop"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"messages": "hi"}, "messages"),
    ],
)
def test_what_cannot_be_served_is_refused_naming_its_field(
    extra: dict[str, Any], param: str
) -> None:
    body = {"messages": HI, **extra}

    def translate() -> None:
        choice_count(body)
        chat_request(body)

    with pytest.raises(ServiceError) as refused:
        translate()
    assert refused.value.param == param
    assert described(refused.value).body()["error"]["param"] == param


def test_seeds_over_int64_are_reduced_to_the_sampler_s_32_bits() -> None:
    assert chat_request({"messages": HI, "seed": 1_733_356_800_123}).seed == (
        1_733_356_800_123 % (1 << 32)
    )
    assert chat_request({"messages": HI, "seed": -1}).seed == (1 << 32) - 1
    assert chat_request({"messages": HI, "seed": (1 << 63) - 1}).seed == (1 << 32) - 1


def test_top_p_zero_is_greedy() -> None:
    request = chat_request({"messages": HI, "top_p": 0, "temperature": 0.9})
    assert not request.HasField("top_p")
    assert request.temperature == 0
    GenerationRequest.from_pb(request)  # valid for the contract, where top_p is in (0, 1]


def test_n_up_to_128() -> None:
    assert choice_count({"n": 128}) == 128


def test_logit_bias_reaches_the_contract_and_its_range_is_openai_s() -> None:
    request = chat_request({"messages": HI, "logit_bias": {"28": 100, "42": -100.0}})
    assert dict(request.logit_bias) == {28: 100.0, 42: -100.0}
    assert GenerationRequest.from_pb(request).sampling.logit_bias == ((28, 100.0), (42, -100.0))
    for bias in (100.5, -101, float("nan")):
        with pytest.raises(InvalidRequest, match="logit_bias") as refused:
            GenerationRequest.from_pb(chat_request({"messages": HI, "logit_bias": {"1": bias}}))
        assert refused.value.param == "logit_bias"


def test_completion_prompts_as_text_token_ids_and_lists() -> None:
    assert completion_requests({"prompt": "a"})[0].prompt == "a"
    (ids,) = completion_requests({"prompt": [1, 2, 3]})
    assert list(ids.prompt_token_ids) == [1, 2, 3]
    assert not ids.prompt
    several = completion_requests({"prompt": ["a", [5, 6], "b"], "max_tokens": 3})
    assert [r.prompt or list(r.prompt_token_ids) for r in several] == ["a", [5, 6], "b"]
    assert all(r.max_tokens == 3 for r in several)
    for prompt in ("", [], [""], [1, -2], [[1], 3], [True]):
        with pytest.raises(InvalidRequest) as refused:
            completion_requests({"prompt": prompt})
        assert refused.value.param == "prompt"


def test_echo_with_logprobs_and_suffix_are_refused_with_the_reason() -> None:
    completion_requests({"prompt": "a", "echo": True})  # echo alone is served
    with pytest.raises(NotSupported, match="log-probabilities of the prompt") as refused:
        completion_requests({"prompt": "a", "echo": True, "logprobs": 1})
    assert refused.value.param == "echo"
    with pytest.raises(NotSupported, match="suffix"):
        completion_requests({"prompt": "a", "suffix": "z"})


def test_tokenize_bodies() -> None:
    asked, ignored = tokenize_request({"model": "m", "prompt": "Hi", "add_special_tokens": True})
    assert (asked.model, asked.prompt, ignored) == ("m", "Hi", ["add_special_tokens"])
    asked, _ = tokenize_request({"messages": HI, "tools": None})
    assert [m.content for m in asked.messages] == ["Hi"]
    with pytest.raises(InvalidRequest):
        tokenize_request({"model": "m"})
    asked_ids, _ = detokenize_request({"tokens": [1, 2]})
    assert list(asked_ids.token_ids) == [1, 2]
    with pytest.raises(InvalidRequest, match="token ids"):
        detokenize_request({"tokens": ["a"]})


ERRORS = [
    (ContextOverflow("This model's maximum context length is 10 tokens"), 400,
     "context_length_exceeded", "messages"),
    (ModelNotFound("no model named 'x'"), 404, "model_not_found", "model"),
    (Unauthenticated("a bearer token is required"), 401, "invalid_api_key", None),
    (Overloaded("too many requests"), 429, "rate_limit_exceeded", None),
    (InvalidRequest("bad", param="temperature"), 400, "invalid_argument", "temperature"),
    (Unavailable("draining"), 503, "unavailable", None),
    (RuntimeError("a bug"), 500, "internal", None),
]  # fmt: skip


@pytest.mark.parametrize(("error", "status", "code", "param"), ERRORS)
def test_errors_carry_the_codes_openai_clients_classify_by(
    error: Exception, status: int, code: str, param: str | None
) -> None:
    told = described(error, overflow_param="messages")
    assert (told.http_status, told.code, told.param) == (status, code, param)
    validate(told.body(), "ErrorResponse")
    retry = told.headers().get("Retry-After")
    assert (retry is not None) == (status in (429, 503))


def test_an_engine_s_context_overflow_crosses_the_socket_as_itself() -> None:
    sent = ContextOverflow("This model's maximum context length is 10 tokens", param="prompt")
    came = wire.error_of(wire.status_of(sent))
    assert type(came) is ContextOverflow
    assert (came.message, came.param, came.code) == (sent.message, "prompt", sent.code)
    plain = wire.error_of(wire.status_of(InvalidRequest("x", param="logit_bias")))
    assert type(plain) is InvalidRequest
    assert plain.param == "logit_bias"
    assert plain.code == grpc.StatusCode.INVALID_ARGUMENT


def started(model: str = "m", prompt_tokens: int = 5) -> pb.GenerateResponse:
    return pb.GenerateResponse(
        started=pb.GenerationStarted(model=model, prompt_tokens=prompt_tokens)
    )


def delta(text: str, logprob: float | None = None) -> pb.GenerateResponse:
    entries = [] if logprob is None else [pb.TokenLogprob(token=text.encode(), logprob=logprob)]
    return pb.GenerateResponse(delta=pb.TextDelta(text=text, logprobs=entries))


def finished(reason: Any = pb.FINISH_REASON_LENGTH, **fields: Any) -> pb.GenerateResponse:
    usage = pb.Usage(prompt_tokens=5, completion_tokens=2)
    return pb.GenerateResponse(
        finished=pb.GenerationFinished(finish_reason=reason, usage=usage, **fields)
    )


def replayed(reply: Reply, events: list[pb.GenerateResponse]) -> list[dict[str, Any]]:
    return [chunk for event in events for chunk in reply.chunks(event)]


def test_chat_answers_carry_refusal_null_and_validate() -> None:
    reply = Reply(True, completion_id(True))
    chunks = replayed(reply, [started(), delta("Hel", -0.1), delta("lo", -0.2), finished()])
    whole = whole_of([reply])
    assert whole["choices"][0]["message"]["refusal"] is None
    assert whole["choices"][0]["logprobs"]["refusal"] is None
    validate(whole, "CreateChatCompletionResponse")
    for chunk in chunks:
        validate(chunk, "CreateChatCompletionStreamResponse")


def test_completion_ids_are_made_by_the_server_and_unique() -> None:
    ids = {completion_id(True) for _ in range(1000)}
    assert len(ids) == 1000
    assert all(i.startswith("chatcmpl-") for i in ids)
    assert completion_id(False).startswith("cmpl-")


CUT_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa'
ONE_CALL = pb.ToolCall(id="call_1", name="get_weather", arguments_json='{"city": "Paris"}')


@pytest.mark.parametrize("calls", [[], [ONE_CALL]], ids=["no call ended", "a call, then a cut"])
def test_a_forced_call_cut_off_leaves_no_markup_in_content(calls: list[pb.ToolCall]) -> None:
    """Issue 40: the parse keeps a call cut off by max_tokens as text."""
    text = ("<tool_call>...</tool_call>\n" if calls else "") + CUT_CALL
    events = [
        started(),
        delta(text),
        finished(content=CUT_CALL, tool_calls=calls, tool_call_errors=["tool call 2: ..."]),
    ]
    whole = Reply(True, "chatcmpl-1", hold_text=True, forced=True)
    for event in events:
        whole.take(event)
    answer = whole_of([whole])
    message = answer["choices"][0]["message"]
    assert answer["choices"][0]["finish_reason"] == "length"
    assert message["content"] is None
    assert [c["function"]["name"] for c in message.get("tool_calls", [])] == [c.name for c in calls]
    validate(answer, "CreateChatCompletionResponse")
    streamed = Reply(True, "chatcmpl-1", hold_text=True, forced=True)
    chunks = replayed(streamed, events)
    assert not any("tool_call>" in (c["choices"][0]["delta"].get("content") or "") for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_echo_and_the_offsets_of_logprobs_in_completions() -> None:
    reply = Reply(False, "cmpl-1", echo="Say: ")
    chunks = replayed(reply, [started(), delta("Hel", -0.5), delta("lo", -0.1), finished()])
    assert chunks[0]["choices"][0]["text"] == "Say: "  # the prompt first, streamed too
    whole = whole_of([reply])
    assert whole["choices"][0]["text"] == "Say: Hello"
    assert whole["choices"][0]["logprobs"]["text_offset"] == [5, 8]
    validate(whole, "CreateCompletionResponse")
    # OpenAI has no schema of its own for completion chunks: they are this object, with
    # `finish_reason: null` until the last (as OpenAI's own stream sends them).
    validate(chunks[-1], "CreateCompletionResponse")


def test_usage_counts_each_prompt_once_and_every_choice() -> None:
    replies = []
    for prompt_tokens, counts in ((5, True), (5, False), (7, True)):
        reply = Reply(False, "cmpl-1", counts_prompt=counts)
        for event in (started(prompt_tokens=prompt_tokens), delta("x"), finished()):
            reply.take(event)
        reply.finished.usage.prompt_tokens = prompt_tokens  # type: ignore[union-attr]
        replies.append(reply)
    usage = usage_of(replies)
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (12, 6)
    assert usage["total_tokens"] == 18


def test_cors_origins_are_exact_origins_or_any() -> None:
    assert cors_origins(None) == frozenset()
    assert cors_origins("https://a.example, http://localhost:3000") == {
        "https://a.example",
        "http://localhost:3000",
    }
    assert cors_origins("*") == {"*"}
    for wrong in ("a.example", "https://a.example/app", "ftp://a.example"):
        with pytest.raises(ValueError, match="not an origin"):
            cors_origins(wrong)
    with pytest.raises(ValueError, match="not an origin"):
        Settings(http_cors_origins="example.com")


def test_a_schema_violation_is_caught() -> None:
    """The validator itself: an answer without `refusal` (as before issue 40) fails."""
    reply = Reply(True, "chatcmpl-1")
    for event in (started(), delta("hi"), finished()):
        reply.take(event)
    whole = whole_of([reply])
    del whole["choices"][0]["message"]["refusal"]
    with pytest.raises(jsonschema.ValidationError, match="refusal"):
        validate(whole, "CreateChatCompletionResponse")
