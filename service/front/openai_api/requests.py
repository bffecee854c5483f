"""OpenAI request bodies as the contract's GenerateRequest.

The HTTP surface builds the same `inference.v1.GenerateRequest` a gRPC client
sends, and the servicer validates and serves it the same way; only the shapes
differ. Tolerant as OpenAI's API and vLLM are:

- a null is an absent field, at every level the translation reads (not inside
  the JSON a client hands through: a tool's `parameters`, a JSON schema, call
  `arguments`);
- a field the service has no use for is accepted and ignored; `ignored_fields`
  names those a request sent, for the response header and the log;
- what cannot be served as asked is refused with InvalidRequest or
  NotSupported, whose `param` names the field.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from inference.v1 import inference_pb2 as pb
from service.errors import InvalidRequest, NotSupported, excerpt
from service.front.openai_api.json_budget import check_json_budget, refuse_lone_surrogates
from service.text.requests import MAX_JSON_DEPTH, json_depth

Body = dict[str, Any]

# The most choices one request may ask for (`n`, times the prompts of a completion):
# each is a generation of its own, batched with the others, and takes a place at the
# gate; the server's own bounds may allow fewer (see `OpenAiHttp`).
MAX_CHOICES = 128
# A tool's JSON schema sits a few levels inside the body and has a bound of its
# own (MAX_JSON_DEPTH); nothing else a request holds nests near this.
MAX_BODY_DEPTH = MAX_JSON_DEPTH + 8
_UINT32 = (1 << 32) - 1
# The contract's int32 fields (max_tokens, top_k): 2^31 does not fit.
INT32_MAX = (1 << 31) - 1
_INT64 = 1 << 63
# Keys whose values are the client's own JSON, passed through as they are: a null
# there means null (`"default": null` in a schema), not an absent field.
_OPAQUE = frozenset({"parameters", "schema", "arguments", "metadata"})

# Fields read below, or elsewhere (`stream`, `stream_options`).
_COMMON = frozenset(
    {
        "model", "max_tokens", "stop", "temperature", "top_p", "presence_penalty",
        "frequency_penalty", "seed", "n", "logprobs", "logit_bias", "stream", "stream_options",
        # llama-server's extensions, under the contract's names (an SDK's `extra_body`)
        "top_k", "min_p", "repeat_penalty", "grammar",
    }
)  # fmt: skip
CHAT_FIELDS = _COMMON | {
    "messages",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
    "top_logprobs",
    "max_completion_tokens",
    "modalities",
    "audio",
}
COMPLETION_FIELDS = _COMMON | {"prompt", "echo", "suffix", "best_of"}
# Among the fields ignored, OpenAI's that mean nothing here: no end-user ids, stored
# completions, service tiers, reasoning, caches keyed by the client, predicted
# outputs, web search; `functions` and `function_call` (the deprecated form of
# `tools`) too. Named in `x-ignored-fields` like any unknown field.
IGNORED = frozenset(
    {
        "user", "store", "metadata", "service_tier", "reasoning_effort", "verbosity",
        "prompt_cache_key", "prompt_cache_retention", "safety_identifier", "prediction",
        "web_search_options", "functions", "function_call",
    }
)  # fmt: skip


def parse_body(raw: bytes) -> Body:
    """A request body as a JSON object, nulls absent, or InvalidRequest saying why it
    is not one: past the item budget (`json_budget.check_json_budget`), too deep, or with a
    lone surrogate in a string. The HTTP port calls it on a body worker, off the loop."""
    too_deep = InvalidRequest(f"the request body nests deeper than {MAX_BODY_DEPTH} levels")
    check_json_budget(raw)
    try:
        body = json.loads(raw)
    except ValueError as exc:  # also UnicodeDecodeError, and integers of 4,300+ digits
        raise InvalidRequest(f"the request body is not JSON: {exc}") from exc
    except RecursionError:
        raise too_deep from None
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    if json_depth(body) > MAX_BODY_DEPTH:
        raise too_deep
    refuse_lone_surrogates(raw, body)
    return without_nulls(body)


def without_nulls(body: Body) -> Body:
    """`body` with every null field left out, nested objects and arrays included, but
    not inside a client's own JSON (`_OPAQUE`). Iterative: the depth is bounded, but
    not by the interpreter's recursion limit."""
    root: Body = {}
    pending: list[tuple[Any, Any]] = [(body, root)]
    while pending:
        source, target = pending.pop()
        items = source.items() if isinstance(source, dict) else enumerate(source)
        for key, value in items:
            if value is None and isinstance(source, dict):
                continue
            if isinstance(value, dict | list) and not (isinstance(key, str) and key in _OPAQUE):
                copy: Any = {} if isinstance(value, dict) else []
                pending.append((value, copy))
                value = copy
            if isinstance(target, dict):
                target[key] = value
            else:
                target.append(value)
    return root


def ignored_fields(body: Body, chat: bool) -> list[str]:
    """The fields of `body` that change nothing, sorted: OpenAI's that the service has
    no use for (IGNORED) and any it does not know."""
    return sorted(set(body) - (CHAT_FIELDS if chat else COMPLETION_FIELDS))


def chat_request(body: Body) -> pb.GenerateRequest:
    """POST /v1/chat/completions."""
    body = without_nulls(body)
    _check_choices(body)
    _check_flags(body, "stream", "logprobs", "parallel_tool_calls")
    _refuse_outputs_not_served(body)
    request = pb.GenerateRequest(model=_text(body, "model", default=""))
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest(
            "`messages` must be a non-empty array of {role, content} objects", param="messages"
        )
    request.messages.extend(_message(m, index) for index, m in enumerate(messages))
    if _tools_offered(body):
        request.tools.extend(_tool(t, index) for index, t in enumerate(body["tools"]))
    _tool_choice(body, request)
    _response_format(body.get("response_format"), request)
    _sampling(body, request)
    if body.get("logprobs"):
        request.logprobs = True
        if body.get("top_logprobs") is not None:
            request.top_logprobs = _int(body, "top_logprobs", 0, 20)
    elif body.get("top_logprobs"):
        raise InvalidRequest("`top_logprobs` needs `logprobs: true`", param="top_logprobs")
    return request


def completion_request(body: Body) -> pb.GenerateRequest:
    """POST /v1/completions, its first prompt (what a router needs of it)."""
    return completion_requests(body)[0]


def completion_requests(body: Body) -> list[pb.GenerateRequest]:
    """POST /v1/completions: one request per prompt (a string or token ids), in order."""
    body = without_nulls(body)
    _check_choices(body)
    _check_flags(body, "stream", "echo")
    if body.get("suffix"):
        raise NotSupported("`suffix` (fill in the middle) is not served", param="suffix")
    if body.get("echo") and body.get("logprobs") is not None:
        raise NotSupported(
            "`echo` with `logprobs` is not served: it asks for the log-probabilities of the "
            "prompt's tokens, which are not computed here; leave out one of them",
            param="echo",
        )
    requests = []
    for prompt in prompts(body):
        request = pb.GenerateRequest(model=_text(body, "model", default=""))
        if isinstance(prompt, str):
            request.prompt = prompt
        else:
            request.prompt_token_ids.extend(prompt)
        _sampling(body, request)
        if body.get("logprobs") is not None:
            request.logprobs = True
            request.top_logprobs = _int(body, "logprobs", 0, 5)
        requests.append(request)
    return requests


Prompt = str | list[int]


def prompts(body: Body) -> list[Prompt]:
    """A completion's prompts: a string, token ids, or an array of either."""
    prompt = body.get("prompt")
    if isinstance(prompt, str | list) and _is_prompt(prompt):
        return [prompt]
    if isinstance(prompt, list) and prompt and all(_is_prompt(p) for p in prompt):
        if len(prompt) > MAX_CHOICES:
            raise InvalidRequest(
                f"at most {MAX_CHOICES} prompts in one request, got {len(prompt)}", param="prompt"
            )
        return list(prompt)
    raise InvalidRequest(
        "`prompt` must be a non-empty string, an array of token ids, or a non-empty array "
        "of either",
        param="prompt",
    )


def _is_prompt(value: object) -> bool:
    if isinstance(value, str):
        return bool(value)
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 31 for v in value)
    )


def _check_flags(body: Body, *names: str) -> None:
    """Booleans must be booleans: `"stream": "false"` is a string, and truthy."""
    for name in names:
        if body.get(name) is not None and not isinstance(body[name], bool):
            raise InvalidRequest(f"`{name}` must be true or false", param=name)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise InvalidRequest(
            '`stream_options` must be an object such as {"include_usage": true}',
            param="stream_options",
        )


def _refuse_outputs_not_served(body: Body) -> None:
    """Asking for audio out: this service writes text only."""
    modalities = body.get("modalities")
    if modalities is not None and (
        not isinstance(modalities, list) or any(m != "text" for m in modalities)
    ):
        raise NotSupported(
            'only text is generated here: `modalities` may only be ["text"]', param="modalities"
        )
    if body.get("audio") is not None:
        raise NotSupported("audio output is not served", param="audio")


def wants_usage_in_stream(body: Body) -> bool:
    options = body.get("stream_options") or {}
    return isinstance(options, dict) and bool(options.get("include_usage"))


def _sampling(body: Body, request: pb.GenerateRequest) -> None:
    for name in ("max_completion_tokens", "max_tokens"):  # the newer name first
        if body.get(name) is not None:
            request.max_tokens = _int(body, name, 1, INT32_MAX)
            break
    request.stop.extend(_stops(body.get("stop")))
    for name in ("temperature", "top_p", "presence_penalty", "frequency_penalty"):
        if body.get(name) is not None:
            setattr(request, name, _number(body, name))
    if request.HasField("top_p") and request.top_p == 0:
        # OpenAI allows 0: only the most likely token is left, which is greedy decoding.
        request.ClearField("top_p")
        request.temperature = 0
    if body.get("seed") is not None:
        # Any int64, as OpenAI's schema has it; the samplers take 32 bits of it.
        request.seed = _int(body, "seed", -_INT64, _INT64 - 1) & _UINT32
    if body.get("logit_bias") is not None:
        request.logit_bias.update(_logit_bias(body["logit_bias"]))
    for name in ("top_k",):
        if body.get(name) is not None:
            setattr(request, name, _int(body, name, 0, 1 << 20))
    for name in ("min_p", "repeat_penalty"):
        if body.get(name) is not None:
            setattr(request, name, _number(body, name))
    if body.get("grammar") is not None:
        request.grammar = _text(body, "grammar", default="")


def _logit_bias(value: object) -> dict[int, float]:
    """OpenAI's logit_bias: token ids (as JSON keys, strings) to a bias. Its range and
    count are the contract's to check, the ids the model's."""
    if not isinstance(value, dict):
        raise InvalidRequest(
            '`logit_bias` must be an object of token ids to biases, e.g. {"1234": -100}',
            param="logit_bias",
        )
    biases: dict[int, float] = {}
    for key, bias in value.items():
        try:
            token = int(key)
        except ValueError:
            raise InvalidRequest(
                f"`logit_bias` keys are token ids, not {excerpt(key)}", param="logit_bias"
            ) from None
        if not -(1 << 31) <= token < 1 << 31:
            raise InvalidRequest(f"`logit_bias` names no token {token}", param="logit_bias")
        if isinstance(bias, bool) or not isinstance(bias, int | float):
            raise InvalidRequest(
                f"`logit_bias` of token {token} must be a number", param="logit_bias"
            )
        biases[token] = float(bias) if abs(bias) < 1e30 else float("inf")
    return biases


def _stops(value: object) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    raise InvalidRequest("`stop` must be a string or an array of strings", param="stop")


def _message(message: object, index: int) -> pb.ChatMessage:
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise InvalidRequest(f"{where} must be an object with `role` and `content`", param=where)
    role = message.get("role")
    if not isinstance(role, str) or not role:
        raise InvalidRequest(f'{where}.role must be a string such as "user"', param=where)
    if role == "developer":  # OpenAI's newer name for the system turn
        role = "system"
    turn = pb.ChatMessage(role=role, content=_content(message.get("content"), where))
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise InvalidRequest(f"{where}.tool_calls must be an array of calls", param=where)
    for call_index, call in enumerate(calls):
        turn.tool_calls.append(_call(call, f"{where}.tool_calls[{call_index}]"))
    if message.get("tool_call_id") is not None:
        turn.tool_call_id = str(message["tool_call_id"])
    if isinstance(message.get("name"), str):
        turn.name = message["name"]
    return turn


def _content(content: object, where: str) -> str:
    """A turn's text: a string, or an array of text parts (joined)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise NotSupported(
                    f"{where}.content: only text parts are served, not {kind!r}", param=where
                )
            texts.append(str(part.get("text", "")))
        return "".join(texts)
    raise InvalidRequest(f"{where}.content must be a string or an array of text parts", param=where)


def _call(call: object, where: str) -> pb.ToolCall:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(call, dict) or not isinstance(function, dict):
        raise InvalidRequest(
            f'{where} must be {{id, type: "function", function: {{name, arguments}}}}',
            param=where,
        )
    arguments = function.get("arguments", "{}")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments)
    return pb.ToolCall(
        id=str(call.get("id", "")), name=str(function.get("name", "")), arguments_json=arguments
    )


def _tools_offered(body: Body) -> bool:
    """Whether the tools go to the model: not with tool_choice "none"."""
    tools = body.get("tools")
    if not tools:
        return False
    if not isinstance(tools, list):
        raise InvalidRequest(
            '`tools` must be an array of {type: "function", function: {...}}', param="tools"
        )
    return body.get("tool_choice") != "none"


def _tool_choice(body: Body, request: pb.GenerateRequest) -> None:
    """A forced call: "required" (any tool) or {type: "function", function: {name}}."""
    choice = body.get("tool_choice", "auto")
    if choice in ("auto", "none"):
        return
    function = choice.get("function") if isinstance(choice, dict) else None
    if choice == "required":
        request.tool_choice.SetInParent()
    elif isinstance(function, dict) and isinstance(function.get("name"), str):
        request.tool_choice.name = function["name"]
    else:
        raise InvalidRequest(
            '`tool_choice` must be "auto", "none", "required" or '
            '{"type": "function", "function": {"name": ...}}',
            param="tool_choice",
        )
    # One call unless several are asked for (OpenAI's default is several): small models
    # allowed several tend to repeat calls until max_tokens.
    request.tool_choice.parallel_calls = body.get("parallel_tool_calls") is True


def _tool(tool: object, index: int) -> pb.Tool:
    function = tool.get("function") if isinstance(tool, dict) else None
    if (
        not isinstance(tool, dict)
        or tool.get("type", "function") != "function"
        or not isinstance(function, dict)
    ):
        raise InvalidRequest(
            f'tools[{index}] must be {{type: "function", function: {{name, ...}}}}',
            param=f"tools[{index}]",
        )
    parameters = function.get("parameters")
    return pb.Tool(
        name=str(function.get("name", "")),
        description=str(function.get("description", "")),
        parameters_json=json.dumps(parameters) if parameters is not None else "",
    )


def _response_format(value: object, request: pb.GenerateRequest) -> None:
    if value is None:
        return
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return
    if kind == "json_object":
        request.response_format.json_schema = '{"type": "object"}'
        return
    if kind == "json_schema" and isinstance(value, dict):
        described = value.get("json_schema")
        schema = described.get("schema") if isinstance(described, dict) else None
        if not isinstance(schema, dict):
            raise InvalidRequest(
                "response_format.json_schema.schema must be a JSON Schema object",
                param="response_format",
            )
        request.response_format.json_schema = json.dumps(schema)
        return
    raise InvalidRequest(
        '`response_format.type` must be "text", "json_object" or "json_schema"',
        param="response_format",
    )


def choice_count(body: Body) -> int:
    """`n`: how many completions of each prompt to generate (1 when unset)."""
    if body.get("n") is None:
        return 1
    return _int(body, "n", 1, MAX_CHOICES)


def nth_choice(request: pb.GenerateRequest, index: int) -> pb.GenerateRequest:
    """The request for choice `index`: a set seed moves on by the index, so the
    choices differ from one another and each repeats."""
    if index == 0 or not request.HasField("seed"):
        return request
    choice = pb.GenerateRequest()
    choice.CopyFrom(request)
    choice.seed = (request.seed + index) % (_UINT32 + 1)
    return choice


def _check_choices(body: Body) -> None:
    choice_count(body)
    if body.get("best_of", 1) != 1:
        raise NotSupported("only `best_of: 1` is served", param="best_of")


def _text(body: Body, name: str, default: str) -> str:
    value = body.get(name, default)
    if not isinstance(value, str):
        raise InvalidRequest(f"`{name}` must be a string", param=name)
    return value


def _number(body: Body, name: str) -> float:
    value = body[name]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequest(f"`{name}` must be a number", param=name)
    try:
        return float(value)
    except OverflowError:  # an integer past any float: out of every range served
        raise InvalidRequest(
            f"`{name}` is out of range: {excerpt(str(value), 40)}", param=name
        ) from None


def _int(body: Body, name: str, low: int, high: int) -> int:
    value = body[name]
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidRequest(f"`{name}` must be an integer from {low} to {high}", param=name)
    return value


Translate = Callable[[Body], pb.GenerateRequest]
