"""A model file's chat template renders within a budget of time and output.

The template is code that came with the model; Jinja's sandbox does not stop it
from looping for hours or writing gigabytes on the model's preparation thread.
"""

from __future__ import annotations

import sys
import threading
import time
from types import FrameType
from typing import Any

import grpc
import pytest

from inference.v1 import inference_pb2 as pb
from service.config import ModelConfig
from service.errors import NotSupported
from service.models.embedded import EMBEDDED_MODELS
from service.text import chat_template
from service.text.chat_template import render_chat
from service.text.requests import ChatMessage
from tests.conftest import SMOLLM, collect, finished_of, make_settings, serving
from tests.test_chat_template_tools import QWEN25_TEMPLATE

HI = [ChatMessage(role="user", content="Hi")]
# Ten billion turns of a loop with nothing in it: no output to count.
SPINNING = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
# Ten billion characters.
FLOODING = (
    "{% for i in range(100000) %}{% for j in range(100000) %}0123456789{% endfor %}{% endfor %}"
)


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chat_template, "RENDER_SECONDS", 0.2)


def test_a_template_that_spins_is_stopped_at_its_deadline(quick: None) -> None:
    with pytest.raises(NotSupported, match=r"ran past 0.2 s on this request"):
        render_chat(SPINNING, HI, {}, "m")


def test_a_template_that_floods_is_stopped_at_its_budget() -> None:
    with pytest.raises(NotSupported, match=r"wrote more than \d+ characters"):
        render_chat(FLOODING, HI, {}, "m")


def test_the_budget_grows_with_what_the_request_gives() -> None:
    long = [ChatMessage(role="user", content="x" * (2 << 20))]
    twice = "{% for m in messages %}{{ m.content }}{{ m.content }}{% endfor %}"
    assert len(render_chat(twice, long, {}, "m")) == 4 << 20


def test_a_template_renders_as_jinja_renders_it_and_other_tracers_are_kept() -> None:
    calls: list[str] = []

    def tracer(frame: FrameType, event: str, arg: object) -> Any:
        calls.append(event)
        return None

    sys.settrace(tracer)
    try:
        rendered = render_chat(QWEN25_TEMPLATE, HI, {}, "m")
        assert sys.gettrace() is tracer
    finally:
        sys.settrace(None)
    expected = chat_template._compile(QWEN25_TEMPLATE).render(
        messages=[{"role": "user", "content": "Hi"}], tools=None, add_generation_prompt=True
    )
    assert rendered == expected
    assert calls  # the test's own tracer kept seeing calls around the rendering


def test_a_spinning_model_template_costs_its_own_request_and_the_model_serves_on() -> None:
    smollm = str(EMBEDDED_MODELS[SMOLLM].locate())
    models = {"spinning": ModelConfig(source=smollm, chat_template=SPINNING)}
    with serving(make_settings(models=models)) as (_, stub):
        chat = pb.GenerateRequest(
            model="spinning", messages=[pb.ChatMessage(role="user", content="Hi")]
        )
        outcome: list[grpc.RpcError] = []

        def send_chat() -> None:
            try:
                collect(stub.Generate(chat, timeout=120))
            except grpc.RpcError as exc:
                outcome.append(exc)

        sender = threading.Thread(target=send_chat)
        sender.start()
        time.sleep(0.5)  # the template is spinning now (or about to)
        raw = pb.GenerateRequest(model="spinning", prompt="Hello", max_tokens=3, temperature=0)
        assert finished_of(collect(stub.Generate(raw, timeout=120))).usage.completion_tokens == 3
        sender.join(timeout=120)
    assert outcome
    assert outcome[0].code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"ran past {chat_template.RENDER_SECONDS:g} s" in (outcome[0].details() or "")
