"""`tool_choice`: a forced tool call, in each convention, end to end with the real models.

The grammar is built from the model's chat template, so each convention gets a
model configured with a template that teaches it: SmolLM2 under Qwen 2.5's
template (Hermes), Gemma 3 270M under Gemma's turns (its prompted JSON form),
and SmolLM2 under a template naming FunctionGemma's markers. SmolLM2's own
template teaches none, so it gets the service's default (Hermes-style; see
test_default_tool_convention); a template that shows tools in a convention the
server does not read cannot be forced.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import grpc
import jsonschema
import pytest

from clients.cli import main
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from service.config import ModelConfig
from service.errors import InvalidRequest
from service.grammar.forced_call import forced_call_grammar
from service.grammar.integer_range import integer_range_gbnf
from service.models.embedded import EMBEDDED_MODELS
from service.text.requests import GenerationRequest, Tool, ToolChoice
from service.tools import CONVENTIONS
from service.tools.base import ToolCallParser
from tests.conftest import (
    GEMMA,
    SMOLLM,
    RunningServer,
    collect,
    finished_of,
    make_settings,
    serving,
)
from tests.test_chat_template_tools import QWEN25_TEMPLATE

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CLOCK = {
    "type": "object",
    "properties": {
        "zone": {"enum": ["UTC", "CET", "JST"]},
        "clock": {"enum": ["12h", "24h"]},
    },
    "required": ["zone", "clock"],
    "additionalProperties": False,
}
SCHEMAS: dict[str, dict[str, Any]] = {"get_weather": CITY, "get_time": CLOCK}
TOOLS = [pb.Tool(name=name, parameters_json=json.dumps(schema)) for name, schema in SCHEMAS.items()]

GEMMA_TURNS = (
    "{% for m in messages %}<start_of_turn>{{ m.role }}\n{{ m.content }}<end_of_turn>\n"
    "{% endfor %}<start_of_turn>model\n"
)
# A ChatML template whose system turn teaches FunctionGemma's call syntax.
FUNCTION_GEMMA_TURNS = (
    "<|im_start|>system\nCall a function as <start_function_call>call:NAME{ARGUMENTS}"
    "<end_function_call>.<|im_end|>\n"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "<|im_start|>assistant\n"
)
# A template that shows tools its own way (as Llama 3.1's does), in no convention read here.
OWN_TOOLS_TURNS = (
    "{% if tools %}Functions: {{ tools | tojson }}\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "<|im_start|>assistant\n"
)


# --- Each convention's shape is what its parser reads -----------------------


@pytest.mark.parametrize("parser", [parser for _, parser in CONVENTIONS], ids=lambda p: p.name)
def test_calls_written_in_a_conventions_shape_parse_back(parser: ToolCallParser) -> None:
    shape = parser.shape
    assert shape is not None
    calls = [("get_weather", {"city": "Oslo"}), ("get_time", {"zone": "CET", "clock": "24h"})]
    written = [f"{shape.opening}{n}{shape.between}{json.dumps(a)}{shape.closing}" for n, a in calls]
    if shape.separator is None:
        written = written[:1]
    text = (shape.separator or "").join(written)
    parsed = parser.parse(text)
    assert [(call.name, json.loads(call.arguments_json)) for call in parsed.calls] == calls[
        : len(written)
    ]
    assert parsed.content == ""
    assert parsed.errors == ()


def tools(*names: str) -> tuple[Tool, ...]:
    return tuple(Tool(name, parameters_json=json.dumps(SCHEMAS[name])) for name in names)


def test_a_named_choice_leaves_the_other_tools_out_of_the_grammar() -> None:
    shape = CONVENTIONS[1][1].shape
    assert shape is not None
    grammar = forced_call_grammar(shape, tools("get_weather", "get_time"), ToolChoice("get_time"))
    assert '\\"get_time\\"' in grammar.text
    assert "get_weather" not in grammar.text
    assert "root ::= call\n" in grammar.text + "\n"  # one call unless several are asked for
    several = forced_call_grammar(shape, tools("get_time"), ToolChoice(parallel_calls=True))
    assert "root ::= call (" in several.text  # Hermes writes them one after another


def test_a_tool_schema_past_a_limit_is_refused_in_the_tools_name() -> None:
    shape = CONVENTIONS[1][1].shape
    assert shape is not None
    huge = Tool("big", parameters_json=json.dumps({"type": "string", "maxLength": 10**6}))
    with pytest.raises(InvalidRequest, match=r"tools\[1\] \(big\) parameters_json: maxLength"):
        forced_call_grammar(shape, (*tools("get_time"), huge), ToolChoice())


def test_a_tool_s_integer_bounds_hold_in_its_call() -> None:
    shape = CONVENTIONS[1][1].shape
    assert shape is not None
    volume = {"type": "object", "properties": {"level": {"type": "integer", "maximum": 10}}}
    tool = Tool("set_volume", parameters_json=json.dumps(volume))
    grammar = forced_call_grammar(shape, (tool,), ToolChoice(name="set_volume"))
    assert f"({integer_range_gbnf(None, 10)}) space" in grammar.text


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"tool_choice": pb.ToolChoice()}, "needs `tools`"),
        ({"tools": TOOLS, "tool_choice": pb.ToolChoice(name="get_news")}, "not one of"),
    ],
)
def test_a_choice_the_request_cannot_meet_is_invalid(
    fields: dict[str, object], message: str
) -> None:
    msg = pb.GenerateRequest(prompt="Hi", **fields)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest, match=message):
        GenerationRequest.from_pb(msg)


# --- End to end -------------------------------------------------------------


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[RunningServer, pb_grpc.InferenceStub]]:
    smollm = str(EMBEDDED_MODELS[SMOLLM].locate())
    models = {
        "hermes": ModelConfig(source=smollm, chat_template=QWEN25_TEMPLATE),
        "gemma": ModelConfig(
            source=str(EMBEDDED_MODELS[GEMMA].locate()), chat_template=GEMMA_TURNS
        ),
        "function-gemma": ModelConfig(source=smollm, chat_template=FUNCTION_GEMMA_TURNS),
        "own-tools": ModelConfig(source=smollm, chat_template=OWN_TOOLS_TURNS),
    }
    with serving(make_settings(models=models, cached_sequences=0)) as running:
        yield running


@pytest.fixture(scope="module")
def stub(served: tuple[RunningServer, pb_grpc.InferenceStub]) -> pb_grpc.InferenceStub:
    return served[1]


def assert_valid_calls(finished: pb.GenerationFinished, names: set[str]) -> None:
    assert finished.finish_reason == pb.FINISH_REASON_TOOL_CALL, finished
    assert finished.tool_calls
    assert not finished.tool_call_errors
    for call in finished.tool_calls:
        assert call.name in names
        jsonschema.validate(json.loads(call.arguments_json), SCHEMAS[call.name])


@pytest.mark.parametrize("model", ["hermes", "gemma", "function-gemma"])
def test_a_named_tool_is_called_even_when_the_question_is_about_another(
    stub: pb_grpc.InferenceStub, model: str
) -> None:
    request = pb.GenerateRequest(
        model=model,
        messages=[pb.ChatMessage(role="user", content="Is it raining in Paris?")],
        tools=TOOLS,
        tool_choice=pb.ToolChoice(name="get_time"),
        temperature=0.0,
        max_tokens=96,
    )
    finished = finished_of(collect(stub.Generate(request)))
    assert_valid_calls(finished, {"get_time"})
    assert len(finished.tool_calls) == 1


def test_required_makes_a_model_call_some_tool_instead_of_answering(
    stub: pb_grpc.InferenceStub,
) -> None:
    request = pb.GenerateRequest(
        model="hermes",
        messages=[pb.ChatMessage(role="user", content="What is the capital of France?")],
        tools=TOOLS,
        tool_choice=pb.ToolChoice(),
        temperature=0.0,
        max_tokens=160,
    )
    assert_valid_calls(finished_of(collect(stub.Generate(request))), set(SCHEMAS))


def test_a_template_with_a_convention_not_read_here_is_failed_precondition(
    stub: pb_grpc.InferenceStub,
) -> None:
    request = pb.GenerateRequest(
        model="own-tools",
        messages=[pb.ChatMessage(role="user", content="Weather?")],
        tools=TOOLS,
        tool_choice=pb.ToolChoice(),
    )
    with pytest.raises(grpc.RpcError) as caught:
        collect(stub.Generate(request))
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "tool-call convention" in (caught.value.details() or "")
    # The model still serves: the same request without forcing is answered.
    request.ClearField("tool_choice")
    request.max_tokens = 4
    assert finished_of(collect(stub.Generate(request))).usage.completion_tokens > 0


def test_tool_choice_with_a_grammar_is_invalid_argument(stub: pb_grpc.InferenceStub) -> None:
    request = pb.GenerateRequest(
        model="hermes",
        messages=[pb.ChatMessage(role="user", content="Weather?")],
        tools=TOOLS,
        tool_choice=pb.ToolChoice(),
        grammar='root ::= "x"',
    )
    with pytest.raises(grpc.RpcError) as caught:
        collect(stub.Generate(request))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "leave out `grammar`" in (caught.value.details() or "")


def test_the_command_line_client_forces_a_call_and_prints_it(
    served: tuple[RunningServer, pb_grpc.InferenceStub], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--target", served[0].target, "generate", "--model", "hermes", "--chat"]
    argv += ["--temperature", "0", "--tool", f"get_time={json.dumps(CLOCK)}", "--tool", "ping"]
    assert main([*argv, "--tool-choice", "get_time", "Is it raining?"]) == 0
    err = capsys.readouterr().err
    (line,) = [line for line in err.splitlines() if line.startswith("[tool call: ")]
    name, arguments = line.removeprefix("[tool call: ").removesuffix("]").split(" ", 1)
    assert name == "get_time"
    jsonschema.validate(json.loads(arguments), CLOCK)
    assert "finish: tool_call" in err
