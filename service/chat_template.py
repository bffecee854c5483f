"""Rendering chat messages with a model's own Jinja template.

Templates are rendered the way Hugging Face transformers renders them (a
sandboxed Jinja environment with trim_blocks and lstrip_blocks, plus the
`raise_exception` and `strftime_now` helpers), so a template written for
transformers gives the same prompt here.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from functools import lru_cache
from typing import NoReturn

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from service.errors import InvalidRequest, NotSupported
from service.generation import ChatMessage


class _TemplateRejected(Exception):
    """Raised by a template's own `raise_exception` call."""


def _raise_exception(message: str) -> NoReturn:
    raise _TemplateRejected(message)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


@lru_cache(maxsize=32)
def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


def render_chat(
    template: str | None,
    messages: Sequence[ChatMessage],
    special_tokens: dict[str, str],
    model: str,
) -> str:
    """The prompt text for `messages`, ending where the assistant should reply."""
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
            messages=[{"role": m.role, "content": m.content} for m in messages],
            add_generation_prompt=True,
            **special_tokens,
        )
    except _TemplateRejected as exc:
        raise InvalidRequest(f"the chat template of model {model!r} refused: {exc}") from exc
