"""Rendering chat messages with a model's own Jinja template.

Templates are rendered the way Hugging Face transformers renders them (a
sandboxed Jinja environment with trim_blocks and lstrip_blocks, plus the
`raise_exception` and `strftime_now` helpers and its own `tojson`), so a template written for
transformers gives the same prompt here.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Sequence
from functools import lru_cache
from typing import Any, NoReturn

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from service.errors import InvalidRequest, NotSupported
from service.generation import ChatMessage, Tool


class _TemplateRejected(Exception):
    """Raised by a template's own `raise_exception` call."""


def _raise_exception(message: str) -> NoReturn:
    raise _TemplateRejected(message)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """transformers' `tojson`: keys in their order, no HTML escaping, unlike Jinja's own.

    Templates write tool signatures and call arguments with it, so the model
    sees them as it did in training.
    """
    return json.dumps(
        value,
        ensure_ascii=ensure_ascii,
        indent=indent,
        separators=separators,
        sort_keys=sort_keys,
    )


@lru_cache(maxsize=32)
def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.filters["tojson"] = _tojson
    return env.from_string(source)


def render_chat(
    template: str | None,
    messages: Sequence[ChatMessage],
    special_tokens: dict[str, str],
    model: str,
    tools: Sequence[Tool] = (),
) -> str:
    """The prompt text for `messages`, ending where the assistant should reply.

    Tools, tool calls and tool results reach the template in Hugging Face's
    shapes (see `_tool` and `_message`); a template that does not use them
    renders as if they were absent.
    """
    if template is None:
        raise NotSupported(
            f"model {model!r} has no chat template, so `messages` cannot be used; send a raw "
            "`prompt`, or configure a chat_template for this model"
        )
    try:
        compiled = _compile(template)
    except jinja2.TemplateSyntaxError as exc:
        raise NotSupported(f"the chat template of model {model!r} does not parse: {exc}") from exc
    try:
        return compiled.render(
            messages=[_message(m) for m in messages],
            # transformers passes None, not [], when there are no tools.
            tools=[_tool(t) for t in tools] or None,
            add_generation_prompt=True,
            **special_tokens,
        )
    except _TemplateRejected as exc:
        raise InvalidRequest(f"the chat template of model {model!r} refused: {exc}") from exc


def _tool(tool: Tool) -> dict[str, Any]:
    """A tool as transformers' `apply_chat_template(tools=...)` passes a JSON-schema tool."""
    function = {"name": tool.name, "description": tool.description}
    return {"type": "function", "function": {**function, "parameters": tool.parameters()}}


def _message(message: ChatMessage) -> dict[str, Any]:
    """A turn in transformers' chat format: assistant calls with their arguments as a dict."""
    rendered: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        rendered["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments()},
            }
            for call in message.tool_calls
        ]
    if message.tool_call_id:
        rendered["tool_call_id"] = message.tool_call_id
    if message.name:
        rendered["name"] = message.name
    return rendered
