"""OpenAI request bodies as the contract's GenerateRequest.

The HTTP surface builds the same `inference.v1.GenerateRequest` a gRPC client
sends, and the servicer validates and serves it the same way; only the shapes
differ. What cannot be mapped is refused with InvalidRequest, naming the field.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from inference.v1 import inference_pb2 as pb
from service.errors import InvalidRequest, NotSupported, excerpt
from service.text.requests import MAX_JSON_DEPTH, json_depth

Body = dict[str, Any]

# Fields the translation does not map: read elsewhere (`stream`, `stream_options`;
# `parallel_tool_calls` only with a forced call) or accepted and ignored.
IGNORED = frozenset(
    {"user", "store", "metadata", "parallel_tool_calls", "service_tier", "stream_options", "stream"}
)
_UINT32 = (1 << 32) - 1
# `n`: each choice is a generation of its own, batched with the others.
MAX_CHOICES = 16
# A tool's JSON schema sits a few levels inside the body and has a bound of its
# own (MAX_JSON_DEPTH); nothing else a request holds nests near this.
MAX_BODY_DEPTH = MAX_JSON_DEPTH + 8


def parse_body(raw: bytes) -> Body:
    """A request body as a JSON object, or InvalidRequest saying why it is not one."""
    too_deep = InvalidRequest(f"the request body nests deeper than {MAX_BODY_DEPTH} levels")
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
    return body


def chat_request(body: Body) -> pb.GenerateRequest:
    """POST /v1/chat/completions."""
    _refuse_unknown(body, _CHAT_FIELDS)
    _check_choices(body)
    _check_flags(body, "stream", "logprobs", "parallel_tool_calls")
    request = pb.GenerateRequest(model=_text(body, "model", default=""))
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("`messages` must be a non-empty array of {role, content} objects")
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
        raise InvalidRequest("`top_logprobs` needs `logprobs: true`")
    return request


def completion_request(body: Body) -> pb.GenerateRequest:
    """POST /v1/completions: a prompt of plain text."""
    _refuse_unknown(body, _COMPLETION_FIELDS)
    _check_choices(body)
    _check_flags(body, "stream")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise InvalidRequest(
            "`prompt` must be one non-empty string (a batch of prompts is not served)"
        )
    if body.get("echo") or body.get("suffix") is not None:
        raise NotSupported("`echo` and `suffix` are not supported")
    request = pb.GenerateRequest(model=_text(body, "model", default=""), prompt=prompt)
    _sampling(body, request)
    if body.get("logprobs") is not None:
        request.logprobs = True
        request.top_logprobs = _int(body, "logprobs", 0, 5)
    return request


def _check_flags(body: Body, *names: str) -> None:
    """Booleans must be booleans: `"stream": "false"` is a string, and truthy."""
    for name in names:
        if body.get(name) is not None and not isinstance(body[name], bool):
            raise InvalidRequest(f"`{name}` must be true or false")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise InvalidRequest('`stream_options` must be an object such as {"include_usage": true}')


def wants_usage_in_stream(body: Body) -> bool:
    options = body.get("stream_options") or {}
    return isinstance(options, dict) and bool(options.get("include_usage"))


def _sampling(body: Body, request: pb.GenerateRequest) -> None:
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    if limit is not None:
        request.max_tokens = _int({"max_tokens": limit}, "max_tokens", 1, 1 << 31)
    request.stop.extend(_stops(body.get("stop")))
    for name in ("temperature", "top_p", "presence_penalty", "frequency_penalty"):
        if body.get(name) is not None:
            setattr(request, name, _number(body, name))
    if body.get("seed") is not None:
        request.seed = _int(body, "seed", 0, _UINT32)
    # llama-server's extensions, under the contract's names (an SDK's `extra_body`).
    for name in ("top_k",):
        if body.get(name) is not None:
            setattr(request, name, _int(body, name, 0, 1 << 20))
    for name in ("min_p", "repeat_penalty"):
        if body.get(name) is not None:
            setattr(request, name, _number(body, name))
    if body.get("grammar") is not None:
        request.grammar = _text(body, "grammar", default="")


def _stops(value: object) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    raise InvalidRequest("`stop` must be a string or an array of strings")


def _message(message: object, index: int) -> pb.ChatMessage:
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise InvalidRequest(f"{where} must be an object with `role` and `content`")
    role = message.get("role")
    if not isinstance(role, str) or not role:
        raise InvalidRequest(f'{where}.role must be a string such as "user"')
    if role == "developer":  # OpenAI's newer name for the system turn
        role = "system"
    turn = pb.ChatMessage(role=role, content=_content(message.get("content"), where))
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise InvalidRequest(f"{where}.tool_calls must be an array of calls")
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
                raise NotSupported(f"{where}.content: only text parts are served, not {kind!r}")
            texts.append(str(part.get("text", "")))
        return "".join(texts)
    raise InvalidRequest(f"{where}.content must be a string or an array of text parts")


def _call(call: object, where: str) -> pb.ToolCall:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(call, dict) or not isinstance(function, dict):
        raise InvalidRequest(
            f'{where} must be {{id, type: "function", function: {{name, arguments}}}}'
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
        raise InvalidRequest('`tools` must be an array of {type: "function", function: {...}}')
    return body.get("tool_choice") != "none"


def _tool_choice(body: Body, request: pb.GenerateRequest) -> None:
    """A forced call: "required" (any tool) or {type: "function", function: {name}}."""
    choice = body.get("tool_choice", "auto")
    if choice in ("auto", "none", None):
        return
    function = choice.get("function") if isinstance(choice, dict) else None
    if choice == "required":
        request.tool_choice.SetInParent()
    elif isinstance(function, dict) and isinstance(function.get("name"), str):
        request.tool_choice.name = function["name"]
    else:
        raise InvalidRequest(
            '`tool_choice` must be "auto", "none", "required" or '
            '{"type": "function", "function": {"name": ...}}'
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
            f'tools[{index}] must be {{type: "function", function: {{name, ...}}}}'
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
            raise InvalidRequest("response_format.json_schema.schema must be a JSON Schema object")
        request.response_format.json_schema = json.dumps(schema)
        return
    raise InvalidRequest('`response_format.type` must be "text", "json_object" or "json_schema"')


def choice_count(body: Body) -> int:
    """`n`: how many completions of the prompt to generate (1 when unset)."""
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
        raise NotSupported("only `best_of: 1` is served")


def _refuse_unknown(body: object, known: frozenset[str]) -> None:
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    unknown = sorted(set(body) - known - IGNORED)
    if unknown:
        raise NotSupported(f"unsupported field(s): {', '.join(unknown)}")


def _text(body: Body, name: str, default: str) -> str:
    value = body.get(name, default)
    if not isinstance(value, str):
        raise InvalidRequest(f"`{name}` must be a string")
    return value


def _number(body: Body, name: str) -> float:
    value = body[name]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequest(f"`{name}` must be a number")
    try:
        return float(value)
    except OverflowError:  # an integer past any float: out of every range served
        raise InvalidRequest(f"`{name}` is out of range: {excerpt(str(value), 40)}") from None


def _int(body: Body, name: str, low: int, high: int) -> int:
    value = body[name]
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidRequest(f"`{name}` must be an integer from {low} to {high}")
    return value


_COMMON = frozenset(
    {
        "model", "max_tokens", "stop", "temperature", "top_p", "presence_penalty",
        "frequency_penalty", "seed", "n", "logprobs", "best_of",
        "top_k", "min_p", "repeat_penalty", "grammar",
    }
)  # fmt: skip
_CHAT_FIELDS = _COMMON | {
    "messages",
    "tools",
    "tool_choice",
    "response_format",
    "top_logprobs",
    "max_completion_tokens",
}
_COMPLETION_FIELDS = _COMMON | {"prompt", "echo", "suffix"}

Translate = Callable[[Body], pb.GenerateRequest]
