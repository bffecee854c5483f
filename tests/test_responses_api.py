"""POST /v1/responses at its seams, without a model: the Responses body as the
GenerateRequest the chat translation makes, a generation's events as the
Responses events, and the kept conversations. End to end: test_openai_responses."""

from __future__ import annotations

import json
from typing import Any

import pytest

from inference.v1 import inference_pb2 as pb
from service.errors import InvalidRequest, NotSupported
from service.front.openai_api.conversations import Conversations, History
from service.front.openai_api.requests import chat_request
from service.front.openai_api.response_events import ResponseEvents, sse
from service.front.openai_api.responses_api import responses_request
from tests import openai_schema

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def asked(**body: Any) -> pb.GenerateRequest:
    return responses_request(body, Conversations()).generation


def test_text_input_and_instructions_are_the_chat_of_a_system_and_a_user_turn() -> None:
    generation = asked(
        model="m", input="Hi", instructions="Be brief.", max_output_tokens=7, temperature=0.5
    )
    chat = chat_request(
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi"},
            ],
            "max_completion_tokens": 7,
            "temperature": 0.5,
        }
    )
    assert generation == chat


def test_items_become_turns_calls_joining_the_assistant_turn_before_them() -> None:
    generation = asked(
        input=[
            {"role": "developer", "content": [{"type": "input_text", "text": "Use tools."}]},
            {"type": "message", "role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": '{"celsius": 3}'},
        ],
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
    )
    roles = [(m.role, m.content) for m in generation.messages]
    assert roles == [
        ("system", "Use tools."),
        ("user", "Weather in Oslo?"),
        ("assistant", "Checking."),
        ("tool", '{"celsius": 3}'),
    ]
    assert [c.name for c in generation.messages[2].tool_calls] == ["get_weather"]
    assert generation.messages[3].tool_call_id == "c1"
    assert generation.messages[3].name == "get_weather"  # from the call it answers
    (tool,) = generation.tools
    assert (tool.name, json.loads(tool.parameters_json)) == ("get_weather", WEATHER["parameters"])
    assert generation.tool_choice.name == "get_weather"


def test_text_format_is_the_response_format_and_include_asks_for_logprobs() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    generation = asked(
        input="x",
        text={"format": {"type": "json_schema", "name": "n", "schema": schema, "strict": True}},
        include=["message.output_text.logprobs"],
        top_logprobs=2,
    )
    assert json.loads(generation.response_format.json_schema) == schema
    assert (generation.logprobs, generation.top_logprobs) == (True, 2)
    assert asked(input="x", text={"format": {"type": "json_object"}}).HasField("response_format")
    assert not asked(input="x", text={"format": {"type": "text"}}).HasField("response_format")


def test_tool_choice_none_leaves_the_tools_out_and_allowed_tools_offers_some() -> None:
    assert not asked(input="x", tools=[WEATHER], tool_choice="none").tools
    assert asked(input="x", tools=[WEATHER], tool_choice="required").HasField("tool_choice")
    clock = {**WEATHER, "name": "get_time"}
    allowed = {"type": "allowed_tools", "mode": "required", "tools": [WEATHER]}
    generation = asked(input="x", tools=[WEATHER, clock], tool_choice=allowed)
    assert [tool.name for tool in generation.tools] == ["get_weather"]
    assert generation.HasField("tool_choice")
    assert not generation.tool_choice.name  # any of those offered


def test_unknown_and_ignored_fields_are_accepted() -> None:
    request = responses_request(
        {"input": "x", "reasoning": {"effort": "low"}, "user": "u", "frobnicate": 1},
        Conversations(),
    )
    assert request.ignored == ["frobnicate", "reasoning", "user"]


@pytest.mark.parametrize(
    ("body", "error", "message"),
    [
        ({"tools": [{"type": "web_search"}]}, NotSupported, "built-in tools"),
        ({"tool_choice": {"type": "file_search"}}, NotSupported, "built-in tools"),
        ({"tools": [{"type": "custom", "name": "sql"}]}, NotSupported, "custom"),
        ({"background": True}, NotSupported, "`background`"),
        ({"input": [{"type": "reasoning", "summary": []}]}, NotSupported, "reasoning items"),
        ({"input": [{"type": "web_search_call", "id": "w"}]}, NotSupported, "built-in tools"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
            NotSupported,
            r"input\[0\].content\[0\]: only text",
        ),
        ({"input": []}, InvalidRequest, "`input`"),
        ({"input": [{"role": "tool", "content": "x"}]}, InvalidRequest, r"input\[0\].role"),
        ({"max_output_tokens": 0}, InvalidRequest, "`max_output_tokens`"),
        ({"text": {"format": {"type": "json_schema"}}}, InvalidRequest, "text.format.schema"),
        ({"tool_choice": {"type": "function"}}, InvalidRequest, "`tool_choice`"),
        ({"previous_response_id": "resp_gone"}, InvalidRequest, "is not kept here"),
    ],
)
def test_what_is_not_served_is_refused_saying_why(
    body: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        responses_request({"input": "x", **body}, Conversations())


# --- The events --------------------------------------------------------------


def started() -> pb.GenerateResponse:
    return pb.GenerateResponse(started=pb.GenerationStarted(model="m"))


def delta(text: str) -> pb.GenerateResponse:
    return pb.GenerateResponse(delta=pb.TextDelta(text=text))


def finished(reason: int, **fields: Any) -> pb.GenerateResponse:
    usage = pb.Usage(prompt_tokens=10, completion_tokens=3, cached_prompt_tokens=4)
    return pb.GenerateResponse(
        finished=pb.GenerationFinished(finish_reason=reason, usage=usage, **fields)  # type: ignore[arg-type]
    )


def walk(
    events: list[pb.GenerateResponse], conversations: Conversations | None = None, **body: Any
) -> tuple[ResponseEvents, list[dict[str, Any]]]:
    conversations = conversations if conversations is not None else Conversations()
    request = responses_request({"input": "Hi", **body}, conversations)
    answer = ResponseEvents(request, conversations)
    return answer, [sent for event in events for sent in answer.events(event)]


def test_text_streams_as_openai_s_events_numbered_in_order() -> None:
    answer, events = walk(
        [started(), delta("Hel"), delta("lo"), finished(pb.FINISH_REASON_END_OF_TURN)]
    )
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["response"]["status"] == "in_progress"
    assert events[6]["text"] == "Hello"
    whole = answer.response()
    assert events[-1]["response"] == whole
    assert whole["status"] == "completed"
    assert whole["output"][0]["content"][0]["text"] == "Hello"
    assert whole["usage"] == {
        "input_tokens": 10,
        "input_tokens_details": {"cached_tokens": 4},
        "output_tokens": 3,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 13,
    }
    assert sse(events[4]).startswith(b"event: response.output_text.delta\ndata: {")


def test_a_call_is_a_function_call_item_and_a_cut_answer_is_incomplete() -> None:
    call = pb.ToolCall(id="call_1", name="get_weather", arguments_json='{"city": "Oslo"}')
    _, events = walk(
        [
            started(),
            delta("<tool_call>..."),
            finished(pb.FINISH_REASON_TOOL_CALL, tool_calls=[call]),
        ],
        tools=[WEATHER],
    )
    kinds = [e["type"] for e in events]
    assert kinds[2:] == [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    item = events[-1]["response"]["output"][0]
    assert (item["type"], item["call_id"], item["name"]) == (
        "function_call",
        "call_1",
        "get_weather",
    )
    assert item["arguments"] == '{"city": "Oslo"}'
    answer, events = walk([started(), delta("Once"), finished(pb.FINISH_REASON_LENGTH)])
    assert events[-1]["type"] == "response.incomplete"
    assert answer.response()["incomplete_details"] == {"reason": "max_output_tokens"}
    assert answer.response()["output"][0]["status"] == "incomplete"


def test_an_error_after_the_start_ends_the_stream_as_failed() -> None:
    answer, events = walk([started(), delta("Hi")])
    body = {"error": {"message": "boom", "type": "server_error", "param": None, "code": "internal"}}
    error, failed = answer.failed(body)
    assert (error["type"], error["code"], error["message"]) == ("error", "internal", "boom")
    assert failed["type"] == "response.failed"
    assert failed["response"]["error"] == {"code": "server_error", "message": "boom"}
    assert error["sequence_number"] == events[-1]["sequence_number"] + 1


# --- The kept conversations -----------------------------------------------------


def test_a_finished_response_is_kept_unless_store_is_false() -> None:
    conversations = Conversations()
    kept, _ = walk(
        [started(), delta("Hello"), finished(pb.FINISH_REASON_END_OF_TURN)], conversations
    )
    history = conversations.conversation(kept.id)
    assert [m["role"] for m in history.messages] == ["user", "assistant"]
    assert history.messages[1]["content"] == "Hello"
    # Continuing it puts the kept turns between the instructions and the new input.
    generation = responses_request(
        {"input": "More", "previous_response_id": kept.id, "instructions": "Be brief."},
        conversations,
    ).generation
    assert [m.content for m in generation.messages] == ["Be brief.", "Hi", "Hello", "More"]
    dropped, _ = walk(
        [started(), delta("x"), finished(pb.FINISH_REASON_END_OF_TURN)], conversations, store=False
    )
    with pytest.raises(InvalidRequest, match="only with `store` true"):
        conversations.conversation(dropped.id)


def test_conversations_are_bounded_least_recently_used_first() -> None:
    conversations = Conversations(max_responses=2, max_characters=250)
    turn = [{"role": "user", "content": "x" * 40}]
    conversations.keep("a", History(), turn)
    conversations.keep("b", History(), turn)
    conversations.conversation("a")  # used: "b" is now the oldest
    conversations.keep("c", History(), turn)
    assert len(conversations) == 2
    with pytest.raises(InvalidRequest):
        conversations.conversation("b")
    # A continuation counts its whole conversation: a long one pushes the others out.
    conversations.keep("d", conversations.conversation("c"), turn * 2)
    assert len(conversations) == 1
    conversations.keep("huge", History(), [{"role": "user", "content": "x" * 500}])
    with pytest.raises(InvalidRequest):
        conversations.conversation("huge")  # larger than the whole bound: not kept
    assert len(conversations.conversation("d").messages) == 3


# --- Against OpenAI's own schemas (tests/schemas/openai) -----------------------------


def event_schemas() -> dict[str, str]:
    """Each stream event's schema in OpenAI's document, by its `type`."""
    found = {}
    for ref in openai_schema.schema("ResponseStreamEvent")["anyOf"]:
        name = ref["$ref"].rsplit("/", 1)[1]
        found[openai_schema.schema(name)["properties"]["type"]["enum"][0]] = name
    return found


def test_responses_and_their_events_validate_against_openai_s_schemas() -> None:
    call = pb.ToolCall(id="call_1", name="get_weather", arguments_json='{"city": "Oslo"}')
    walks = [
        walk(
            [started(), delta("Hel"), delta("lo"), finished(pb.FINISH_REASON_END_OF_TURN)],
            instructions="Be brief.",
            metadata={"purpose": "test"},
            text={"format": {"type": "json_schema", "name": "p", "schema": {"type": "object"}}},
        ),
        walk(
            [
                started(),
                delta("<tool_call>"),
                finished(pb.FINISH_REASON_TOOL_CALL, tool_calls=[call]),
            ],
            tools=[WEATHER],
            tool_choice={"type": "function", "name": "get_weather"},
        ),
        walk(
            [started(), delta("Once"), finished(pb.FINISH_REASON_LENGTH)],
            max_output_tokens=3,
            store=False,
        ),
    ]
    schemas = event_schemas()
    for answer, events in walks:
        openai_schema.validate(answer.response(), "Response")
        for event in events:
            openai_schema.validate(event, schemas[event["type"]])
    answer, _ = walk([started(), delta("Hi")])
    body = {"error": {"message": "boom", "type": "server_error", "param": None, "code": "internal"}}
    for event in answer.failed(body):
        openai_schema.validate(event, schemas[event["type"]])
