"""Rendering a model file's chat template within a budget of time and output.

A chat template is code that came with the model, from wherever the operator
pulled it. Jinja's sandbox keeps it from reaching outside, but not from
looping: `range` allows 100,000 items, and loops nest, so a template can spin
for hours or write gigabytes. It renders on the model's preparation thread,
where every request of that model waits behind it. So rendering is bounded:

- in time, by a trace function that is active only in the template's own frames
  (Jinja compiles templates to Python code named `<template>`): it checks the
  clock at each line there and raises past the deadline. Python cannot stop a
  thread from outside; this stops it from inside. It costs about as much again
  as the rendering itself (a third of a millisecond for 40 turns and 10 tools);
- in output, by counting what the template writes as it writes it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import jinja2

# Jinja's name for the code it compiles from a template given as a string.
_TEMPLATE_CODE = "<template>"


class RenderTimedOut(Exception):
    """The template ran past its time."""


class RenderTooLong(Exception):
    """The template wrote more than its budget."""


def render_within(
    template: jinja2.Template, variables: dict[str, Any], seconds: float, max_chars: int
) -> str:
    """`template` rendered with `variables`, or RenderTimedOut / RenderTooLong."""
    pieces: list[str] = []
    written = 0
    with _deadline(seconds):
        for piece in template.generate(**variables):
            written += len(piece)
            if written > max_chars:
                raise RenderTooLong(written)
            pieces.append(piece)
    return "".join(pieces)


@contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    """Template code run by this thread inside the block raises RenderTimedOut past
    `seconds`. Any other tracer (a debugger, coverage) is set back afterwards."""
    deadline = time.monotonic() + seconds

    def in_template(frame: FrameType, event: str, arg: object) -> Any:
        if time.monotonic() > deadline:
            raise RenderTimedOut(seconds)
        return in_template

    def on_call(frame: FrameType, event: str, arg: object) -> Any:
        if frame.f_code.co_filename == _TEMPLATE_CODE:
            return in_template(frame, event, arg)
        return None  # no line events outside the template: its helpers run at full speed

    previous = sys.gettrace()
    sys.settrace(on_call)
    try:
        yield
    finally:
        sys.settrace(previous)
