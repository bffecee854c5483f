"""Rendering chat messages with a model's own Jinja template.

A message's role must be one the template can place: the four every chat
format knows (system, user, assistant, tool), or one the template itself
compares a role with (`message['role'] == 'ipython'`). Anything else would be
pasted into the prompt verbatim by templates that print the role, so a client
could write its own turn markers.

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
from jinja2 import meta, nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from service.errors import InvalidRequest, NotSupported, excerpt
from service.text.requests import ChatMessage, Tool
from service.text.template_budget import RenderTimedOut, RenderTooLong, render_within


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


STANDARD_ROLES = frozenset({"system", "user", "assistant", "tool"})
# A template's budget (see template_budget): rendering takes milliseconds, and a
# template adds its own text around what the request gives it, and may repeat it.
RENDER_SECONDS = 5.0
RENDER_GROWTH = 8  # tool schemas written with tojson(indent=4) grow several times
RENDER_SLACK_CHARS = 1 << 20
_MAX_ROLE_CHARS = 64


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.filters["tojson"] = _tojson
    return env


@lru_cache(maxsize=32)
def _compile(source: str) -> jinja2.Template:
    return _environment().from_string(source)


@lru_cache(maxsize=32)
def template_roles(source: str) -> frozenset[str]:
    """The standard roles, plus every string the template compares a role with."""
    roles: set[str] = set()
    for compare in _environment().parse(source).find_all(nodes.Compare):
        operands = [compare.expr, *(operand.expr for operand in compare.ops)]
        if any(_names_role(operand) for operand in operands):
            for operand in operands:
                roles.update(_strings(operand))
    return STANDARD_ROLES | roles


@lru_cache(maxsize=32)
def template_variables(source: str) -> frozenset[str]:
    """The variables the template reads from what it is given (`messages`, `tools`,
    `bos_token`, ...); none for a template that does not parse, which rendering reports."""
    try:
        return frozenset(meta.find_undeclared_variables(_environment().parse(source)))
    except (jinja2.TemplateError, RecursionError):
        return frozenset()


def _names_role(node: nodes.Node) -> bool:
    """`message['role']`, `message.role`, or a variable called like a role."""
    if isinstance(node, nodes.Getitem):
        return isinstance(node.arg, nodes.Const) and node.arg.value == "role"
    if isinstance(node, nodes.Getattr):
        return node.attr == "role"
    return isinstance(node, nodes.Name) and "role" in node.name


def _strings(node: nodes.Node) -> set[str]:
    if isinstance(node, nodes.Const) and isinstance(node.value, str):
        return {node.value} if len(node.value) <= _MAX_ROLE_CHARS else set()
    if isinstance(node, nodes.List | nodes.Tuple):
        return {text for item in node.items for text in _strings(item)}
    return set()


def _check_roles(source: str, messages: Sequence[ChatMessage], model: str) -> None:
    roles = template_roles(source)
    for index, message in enumerate(messages):
        if message.role not in roles:
            raise InvalidRequest(
                f"messages[{index}] has the role {excerpt(message.role)}, which the chat "
                f"template of model {model!r} does not handle; use one of "
                f"{', '.join(sorted(roles))}"
            )


def render_chat(
    template: str | None,
    messages: Sequence[ChatMessage],
    special_tokens: dict[str, str],
    model: str,
    tools: Sequence[Tool] = (),
) -> str:
    """The prompt text for `messages`, ending where the assistant should reply.

    Tools, tool calls and tool results reach the template in Hugging Face's
    shapes (see `tool_signature` and `_message`); a template that does not use them
    renders as if they were absent (the engine hands such a template the tools
    written into the turns instead: service.tools.default_convention).
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
    _check_roles(template, messages, model)
    variables = {
        "messages": [_message(m) for m in messages],
        # transformers passes None, not [], when there are no tools.
        "tools": [tool_signature(t) for t in tools] or None,
        "add_generation_prompt": True,
        **special_tokens,
    }
    budget = RENDER_GROWTH * _given_chars(messages, tools) + RENDER_SLACK_CHARS
    try:
        return render_within(compiled, variables, RENDER_SECONDS, budget)
    except _TemplateRejected as exc:
        raise InvalidRequest(f"the chat template of model {model!r} refused: {exc}") from exc
    except RenderTimedOut:
        raise NotSupported(
            f"the chat template of model {model!r} ran past {RENDER_SECONDS:g} s on this request; "
            "configure a chat_template for it"
        ) from None
    except RenderTooLong:
        raise NotSupported(
            f"the chat template of model {model!r} wrote more than {budget} characters for "
            "this request; configure a chat_template for it"
        ) from None


def _given_chars(messages: Sequence[ChatMessage], tools: Sequence[Tool]) -> int:
    """How much text the request gives the template to place."""
    in_messages = sum(
        len(m.content) + sum(len(c.name) + len(c.arguments_json) for c in m.tool_calls)
        for m in messages
    )
    return in_messages + sum(len(t.description) + len(t.parameters_json) for t in tools)


def tool_signature(tool: Tool) -> dict[str, Any]:
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
