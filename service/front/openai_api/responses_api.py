"""POST /v1/responses (OpenAI's Responses API) as the contract's GenerateRequest.

A Responses body is rewritten as the chat completions body it means, and that
body goes through the chat translation (`requests.chat_request`): messages,
tools, forced calls, JSON schemas and sampling are read in one place for both
APIs, and from there a response is a chat completion served by the same
Generate. What differs is only the shape:

- `input` (a string, or a list of items: messages with roles user, assistant,
  system or developer, their content a string or `input_text`/`output_text`
  parts; `function_call` and `function_call_output` items) becomes `messages`,
  with `instructions` as a system turn ahead of them and the kept conversation
  of `previous_response_id` (`conversations`) between the two;
- tools are flat (`{type: "function", name, parameters}`), and so is a named
  `tool_choice` (`{type: "function", name}`);
- `text.format` is `response_format`, `max_output_tokens` is
  `max_completion_tokens`, `include: ["message.output_text.logprobs"]` with
  `top_logprobs` asks for log-probabilities.

OpenAI's built-in tools (web search, file search, code, images and MCP servers,
which it runs on services of its own; a computer, a shell and patches, which its
models are trained to drive), custom free-form tools, reasoning items,
background mode, stored prompts and conversation objects are refused with a 400
that says why. Fields that change nothing here (`user`, `reasoning`,
`truncation`, ...) are accepted and ignored, and so are fields OpenAI does not
define: `ResponsesRequest.ignored` names them all, for the `x-ignored-fields`
header and the log, as for chat completions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from inference.v1 import inference_pb2 as pb
from service.errors import InvalidRequest, NotSupported, excerpt
from service.front.openai_api.conversations import Conversations, History
from service.front.openai_api.requests import INT32_MAX, Body, chat_request

Json = dict[str, Any]

LOGPROBS_INCLUDE = "message.output_text.logprobs"
# The fields read here, each in its own way below.
SERVED = frozenset(
    {
        "model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "seed",
        "stream", "tools", "tool_choice", "parallel_tool_calls", "text", "store",
        "previous_response_id", "include", "top_logprobs", "metadata", "background",
        "conversation", "prompt",
    }
)  # fmt: skip
# llama-server's sampling extensions and the chat fields Responses lacks (an SDK's
# `extra_body`), passed to the chat translation under the same names.
EXTENSIONS = frozenset(
    {"stop", "presence_penalty", "frequency_penalty", "top_k", "min_p", "repeat_penalty", "grammar"}
)
# OpenAI's fields that change nothing here: no reasoning (so no effort or summary),
# no truncation of an input too long (it is refused), no service tiers, caches
# keyed by the client, moderation or end-user ids. Named in `ignored` like any
# field it does not know.
IGNORED = frozenset(
    {
        "user", "safety_identifier", "prompt_cache_key", "prompt_cache_retention",
        "prompt_cache_options", "service_tier", "reasoning", "truncation", "stream_options",
        "max_tool_calls", "context_management", "moderation",
    }
)  # fmt: skip
# OpenAI's built-in tools: run on its own services (search, vector stores, sandboxes,
# MCP servers), or driven by what its models are trained for (a computer, a shell).
BUILT_IN_TOOLS = frozenset(
    {
        "web_search", "web_search_preview", "web_search_2025_08_26",
        "web_search_preview_2025_03_11", "file_search", "computer", "computer_use_preview",
        "code_interpreter", "image_generation", "mcp", "local_shell", "shell",
        "apply_patch", "tool_search",
    }
)  # fmt: skip
# Input items that stand for the work of built-in tools or of a reasoning model.
REFUSED_ITEMS = {
    "reasoning": "reasoning items are not served: the models here do not reason apart "
    "from their answer, so there is nothing to pass back",
    "item_reference": "`item_reference` items are not served: send the item itself",
    "compaction": "compaction items are not served",
}


@dataclass
class ResponsesRequest:
    """One POST /v1/responses: the generation it asks for, and what its answer
    echoes or keeps."""

    body: Body
    generation: pb.GenerateRequest
    # This turn's messages (chat form, instructions left out): kept, with the
    # answer's, for a later `previous_response_id`.
    turn: list[Json]
    history: History = field(default_factory=History)
    tools: list[Json] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)

    @property
    def stream(self) -> bool:
        return self.body.get("stream") is True

    @property
    def store(self) -> bool:
        return self.body.get("store") is not False  # OpenAI keeps responses by default


def responses_request(body: Body, conversations: Conversations) -> ResponsesRequest:
    """The GenerateRequest a Responses body asks for, through the chat translation."""
    return translated_responses_request(body, recalled_history(body, conversations))


def translated_responses_request(body: Body, history: History) -> ResponsesRequest:
    """`responses_request` once the conversation it continues is recalled: pure, so
    the HTTP port runs it off the event loop (`Conversations` stays on the loop)."""
    ignored = sorted(set(body) - SERVED - EXTENSIONS)
    _refuse_unserved(body)
    for name in ("stream", "store", "parallel_tool_calls"):
        if body.get(name) is not None and not isinstance(body[name], bool):
            raise InvalidRequest(f"`{name}` must be true or false", param=name)
    _check_metadata(body.get("metadata"))
    turn = _input_messages(body.get("input"), bool(history.messages))
    _name_results(turn, history)
    tools = _tools(body.get("tools"))
    messages = [*_instructions(body.get("instructions")), *history.messages, *turn]
    generation = chat_request(_chat_body(body, messages, tools))
    return ResponsesRequest(body, generation, turn, history, tools, ignored)


def _chat_body(body: Body, messages: list[Json], tools: list[Json]) -> Body:
    """The chat completions body a Responses body means."""
    chat = {name: body.get(name) for name in EXTENSIONS}
    choice, offered = _tool_choice(body.get("tool_choice"), tools)
    chat.update(
        {
            "model": body.get("model") or "",
            "messages": messages,
            "tools": [_chat_tool(tool) for tool in offered] or None,
            "tool_choice": choice,
            "parallel_tool_calls": body.get("parallel_tool_calls"),
            "response_format": _response_format(body.get("text")),
            "max_completion_tokens": _max_output_tokens(body.get("max_output_tokens")),
            "temperature": body.get("temperature"),
            "top_p": body.get("top_p"),
            "seed": body.get("seed"),
            **_logprobs(body),
        }
    )
    return {name: value for name, value in chat.items() if value is not None}


def _name_results(turn: list[Json], history: History) -> None:
    """A call's result names the function called, as chat's tool turns do; a result
    whose `call_id` no call has (in `input` or the conversation continued) is refused:
    the model would read an answer to a question it never asked."""
    names = {
        call["id"]: call["function"]["name"]
        for message in (*history.messages, *turn)
        for call in message.get("tool_calls", ())
    }
    for message in turn:
        if message["role"] != "tool":
            continue
        call_id = message["tool_call_id"]
        if call_id not in names:
            raise InvalidRequest(
                f"a function_call_output answers call_id {excerpt(call_id, 80)}, but no "
                "function_call in `input` or in the previous response has that call_id",
                param="input",
            )
        message["name"] = names[call_id]


# OpenAI's bounds on a response's `metadata`, which every answer echoes back.
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512


def _check_metadata(value: object) -> None:
    if value is None:
        return
    if not isinstance(value, dict):
        raise InvalidRequest("`metadata` must be an object of strings", param="metadata")
    if len(value) > MAX_METADATA_PAIRS:
        raise InvalidRequest(
            f"`metadata` holds {len(value)} pairs; at most {MAX_METADATA_PAIRS}",
            param="metadata",
        )
    for key, text in value.items():
        if len(key) > MAX_METADATA_KEY:
            raise InvalidRequest(
                f"a `metadata` key is {len(key)} characters long; at most {MAX_METADATA_KEY}",
                param="metadata",
            )
        if not isinstance(text, str) or len(text) > MAX_METADATA_VALUE:
            raise InvalidRequest(
                f"`metadata` value {excerpt(key, 64)} must be a string of at most "
                f"{MAX_METADATA_VALUE} characters",
                param="metadata",
            )


def _refuse_unserved(body: Body) -> None:
    if body.get("background"):
        raise NotSupported(
            "`background` responses are not served: a response runs while its request "
            "is open (stream it to see it as it comes)",
            param="background",
        )
    if body.get("conversation") is not None:
        raise NotSupported(
            "`conversation` objects are not served; continue a response with "
            "`previous_response_id`, or send the conversation as `input`",
            param="conversation",
        )
    if body.get("prompt") is not None:
        raise NotSupported(
            "stored prompts (`prompt`) are not served; send `instructions`", param="prompt"
        )


def recalled_history(body: Body, conversations: Conversations) -> History:
    """The conversation `previous_response_id` continues (none without one)."""
    previous = body.get("previous_response_id")
    if previous is None:
        return History()
    if not isinstance(previous, str) or not previous:
        raise InvalidRequest(
            "`previous_response_id` must be a response's id", param="previous_response_id"
        )
    return conversations.conversation(previous)


def _input_messages(value: object, continued: bool) -> list[Json]:
    """`input` as chat messages: a string is one user turn."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if value is None and continued:
        return []
    if not isinstance(value, list) or not (value or continued):
        raise InvalidRequest(
            "`input` must be a string or a non-empty array of input items", param="input"
        )
    messages: list[Json] = []
    for index, item in enumerate(value):
        _add_item(messages, item, f"input[{index}]")
    return messages


def _add_item(messages: list[Json], item: object, where: str) -> None:
    if not isinstance(item, dict):
        raise InvalidRequest(f"{where} must be an object such as {{role, content}}", param=where)
    kind = item.get("type") or ("message" if "role" in item else None)
    if kind == "message":
        messages.append(_message(item, where))
    elif kind == "function_call":
        call = _function_call(item, where)
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant":  # calls of one turn, its text
            last.setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif kind == "function_call_output":
        call_id = _string(item, "call_id", where)
        output = _content(item.get("output"), f"{where}.output")
        messages.append({"role": "tool", "tool_call_id": call_id, "content": output})
    elif isinstance(kind, str) and kind in REFUSED_ITEMS:
        raise NotSupported(f"{where}: {REFUSED_ITEMS[kind]}", param=where)
    elif isinstance(kind, str) and kind.endswith(("_call", "_call_output")):
        raise NotSupported(
            f"{where}: {kind!r} items are the work of one of OpenAI's built-in tools, "
            "which are not served here; only function calls are",
            param=where,
        )
    else:
        raise InvalidRequest(
            f'{where}.type must be "message", "function_call" or "function_call_output", '
            f"not {excerpt(str(kind), 40)}",
            param=where,
        )


_ROLES = ("user", "assistant", "system", "developer")


def _message(item: Json, where: str) -> Json:
    role = item.get("role")
    if role not in _ROLES:
        raise InvalidRequest(
            f"{where}.role must be one of {', '.join(_ROLES)}", param=f"{where}.role"
        )
    return {"role": role, "content": _content(item.get("content"), f"{where}.content")}


def _content(content: object, where: str) -> str:
    """A string, or text parts joined. Images, files and audio are not served."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest(f"{where} must be a string or an array of content parts", param=where)
    texts = []
    for index, part in enumerate(content):
        at = f"{where}[{index}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if isinstance(part, dict) and kind in ("input_text", "output_text", "text"):
            texts.append(_string(part, "text", at))
        elif isinstance(part, dict) and kind == "refusal":
            texts.append(_string(part, "refusal", at))
        elif kind in ("input_image", "input_file", "input_audio"):
            raise NotSupported(f"{at}: only text is served, not {kind!r}", param=at)
        else:
            raise InvalidRequest(
                f'{at} must be a text part, {{"type": "input_text", "text": ...}}', param=at
            )
    return "".join(texts)


def _function_call(item: Json, where: str) -> Json:
    arguments = item.get("arguments", "{}")
    if not isinstance(arguments, str):
        raise InvalidRequest(
            f"{where}.arguments must be a string of JSON", param=f"{where}.arguments"
        )
    return {
        "id": _string(item, "call_id", where),
        "type": "function",
        "function": {"name": _string(item, "name", where), "arguments": arguments},
    }


def _string(item: Json, name: str, where: str) -> str:
    value = item.get(name)
    if not isinstance(value, str):
        raise InvalidRequest(f"{where}.{name} must be a string", param=f"{where}.{name}")
    return value


def _instructions(value: object) -> list[Json]:
    if value is None or value == "":
        return []
    if not isinstance(value, str):
        raise InvalidRequest("`instructions` must be a string", param="instructions")
    return [{"role": "system", "content": value}]


def _tools(value: object) -> list[Json]:
    """Function tools in the Responses shape, as given (each checked)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidRequest(
            '`tools` must be an array of {type: "function", name, parameters}', param="tools"
        )
    return [_tool(tool, f"tools[{index}]") for index, tool in enumerate(value)]


def _tool(tool: object, where: str) -> Json:
    kind = tool.get("type") if isinstance(tool, dict) else None
    _refuse_built_in(kind, where)
    if kind == "custom":
        raise NotSupported(
            f"{where}: custom (free-form) tools are not served; declare a function tool "
            "with a JSON schema for its arguments",
            param=where,
        )
    if not isinstance(tool, dict) or kind != "function":
        raise InvalidRequest(
            f'{where} must be {{"type": "function", "name": ..., "parameters"}}', param=where
        )
    if isinstance(tool.get("function"), dict):  # chat's nested shape, sent here by some clients
        tool = {"type": "function", **tool["function"]}
    if not isinstance(tool.get("name"), str) or not tool["name"]:
        raise InvalidRequest(f"{where}.name must be the function's name", param=f"{where}.name")
    if tool.get("parameters") is not None and not isinstance(tool["parameters"], dict):
        raise InvalidRequest(
            f"{where}.parameters must be a JSON Schema object", param=f"{where}.parameters"
        )
    description = tool.get("description")
    return {
        "type": "function",
        "name": tool["name"],
        "description": description if isinstance(description, str) else None,
        "parameters": tool.get("parameters"),
        "strict": tool.get("strict") is not False,  # echoed; docs/http.md, "Responses API"
    }


def _chat_tool(tool: Json) -> Json:
    function = {"name": tool["name"], "description": tool["description"] or ""}
    if tool["parameters"] is not None:
        function["parameters"] = tool["parameters"]
    return {"type": "function", "function": function}


def _refuse_built_in(kind: object, where: str) -> None:
    if isinstance(kind, str) and (kind in BUILT_IN_TOOLS or kind.startswith("web_search")):
        raise NotSupported(
            f"{where}: {kind!r} is one of OpenAI's built-in tools, which are not served "
            "here (OpenAI runs them on services of its own, or trains its models to drive "
            "them); only function tools are",
            param=where,
        )


def _tool_choice(value: object, tools: list[Json]) -> tuple[object, list[Json]]:
    """Chat's `tool_choice`, and the tools it offers (`allowed_tools` names some)."""
    if value is None or value in ("auto", "none", "required"):
        return value, tools
    kind = value.get("type") if isinstance(value, dict) else None
    if isinstance(value, dict) and kind == "function" and isinstance(value.get("name"), str):
        return {"type": "function", "function": {"name": value["name"]}}, tools
    if isinstance(value, dict) and kind == "allowed_tools":
        return _allowed_tools(value, tools)
    _refuse_built_in(kind, "`tool_choice`")
    raise InvalidRequest(
        '`tool_choice` must be "auto", "none", "required", {"type": "function", "name": ...} '
        'or {"type": "allowed_tools", "mode": ..., "tools": [...]}',
        param="tool_choice",
    )


def _allowed_tools(choice: Json, tools: list[Json]) -> tuple[object, list[Json]]:
    """`{"type": "allowed_tools", "mode": "auto" or "required", "tools": [{"type":
    "function", "name"}, ...]}`: only those of `tools` are offered."""
    mode, allowed = choice.get("mode", "auto"), choice.get("tools")
    if mode not in ("auto", "required") or not isinstance(allowed, list):
        raise InvalidRequest(
            'tool_choice.allowed_tools needs `mode` "auto" or "required" and `tools`',
            param="tool_choice",
        )
    names = set()
    for index, tool in enumerate(allowed):
        kind = tool.get("type") if isinstance(tool, dict) else None
        _refuse_built_in(kind, f"tool_choice.tools[{index}]")
        if (
            not isinstance(tool, dict)
            or kind != "function"
            or not isinstance(tool.get("name"), str)
        ):
            raise InvalidRequest(
                f'tool_choice.tools[{index}] must be {{"type": "function", "name": ...}}',
                param="tool_choice",
            )
        names.add(tool["name"])
    return mode, [tool for tool in tools if tool["name"] in names]


def _response_format(text: object) -> Json | None:
    if text is None:
        return None
    if not isinstance(text, dict):
        raise InvalidRequest(
            '`text` must be an object such as {"format": {"type": "text"}}', param="text"
        )
    form = text.get("format")
    if form is None:
        return None
    kind = form.get("type") if isinstance(form, dict) else None
    if kind in ("text", "json_object"):
        return {"type": kind}
    if kind == "json_schema" and isinstance(form, dict):
        if not isinstance(form.get("schema"), dict):
            raise InvalidRequest(
                "text.format.schema must be a JSON Schema object", param="text.format.schema"
            )
        return {
            "type": "json_schema",
            "json_schema": {"name": form.get("name") or "output", "schema": form["schema"]},
        }
    raise InvalidRequest(
        'text.format.type must be "text", "json_object" or "json_schema"', param="text.format.type"
    )


def _max_output_tokens(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= INT32_MAX:
        raise InvalidRequest(
            f"`max_output_tokens` must be an integer from 1 to {INT32_MAX}",
            param="max_output_tokens",
        )
    return value


def _logprobs(body: Body) -> Json:
    """`include: ["message.output_text.logprobs"]`, with `top_logprobs` alternatives."""
    include = body.get("include") or []
    if not isinstance(include, list) or not all(isinstance(name, str) for name in include):
        raise InvalidRequest("`include` must be an array of strings", param="include")
    if LOGPROBS_INCLUDE not in include:
        return {}  # the others name output of built-in tools or reasoning: there is none
    return {"logprobs": True, "top_logprobs": body.get("top_logprobs")}
