"""POST /v1/responses (issue 40) against a live server, with the clients that call it:
the official `openai` SDK, litellm and LangChain.

One server with `--http-listen`: SmolLM2 as the default, and SmolLM2 under a
Hermes-style template as "hermes" for function tools (SmolLM2's own template teaches
no tool convention). The seams, without a model: test_responses_api.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx2 as httpx
import jsonschema
import openai
import pytest

from service.config import ModelConfig
from service.models.embedded import EMBEDDED_MODELS
from tests import openai_schema
from tests.conftest import SMOLLM, RunningServer, make_settings, serving
from tests.test_chat_template_tools import QWEN25_TEMPLATE
from tests.test_generation_features import PERSON
from tests.test_responses_api import event_schemas

WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
CLOCK: Any = {
    "type": "function",
    "name": "get_time",
    "parameters": {
        "type": "object",
        "properties": {"zone": {"enum": ["UTC", "CET"]}},
        "required": ["zone"],
    },
}
QUESTION = "What is the capital of France?"
TEXT_EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    # response.output_text.delta, one or more
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
]


@pytest.fixture(scope="module")
def running() -> Iterator[RunningServer]:
    source = str(EMBEDDED_MODELS[SMOLLM].locate())
    models = {"hermes": ModelConfig(source=source, chat_template=QWEN25_TEMPLATE)}
    # No prompt cache: the tests compare answers to one prompt (see test_openai_http).
    settings = make_settings(models=models, http_listen="127.0.0.1:0", cached_sequences=0)
    with serving(settings) as (server, _):
        yield server


@pytest.fixture(scope="module")
def base_url(running: RunningServer) -> str:
    assert running.server.http is not None
    return f"http://127.0.0.1:{running.server.http.port}/v1"


@pytest.fixture(scope="module")
def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="none", max_retries=0)


def respond(client: openai.OpenAI, **fields: Any) -> Any:
    """A response, the SDK's typed parameters taken as given."""
    return client.responses.create(**fields)


def test_a_response_is_the_chat_completion_of_its_instructions_and_input(
    client: openai.OpenAI,
) -> None:
    raw = client.responses.with_raw_response.create(
        model=SMOLLM,
        instructions="Answer in one short sentence.",
        input=QUESTION,
        max_output_tokens=12,
        temperature=0,
        extra_headers={"x-request-id": "responses-1"},
    )
    assert raw.headers["x-request-id"] == "responses-1"
    response: Any = raw.parse()
    assert response.object == "response"
    assert response.id.startswith("resp_")
    assert response.status in ("completed", "incomplete")
    (message,) = response.output
    assert (message.type, message.role) == ("message", "assistant")
    assert response.output_text
    chat = client.chat.completions.create(
        model=SMOLLM,
        messages=[
            {"role": "system", "content": "Answer in one short sentence."},
            {"role": "user", "content": QUESTION},
        ],
        max_tokens=12,
        temperature=0,
    )
    assert response.output_text == chat.choices[0].message.content
    usage = response.usage
    assert usage is not None
    assert chat.usage is not None
    # The same prompt: the instructions were its system turn (without one, SmolLM2's
    # template writes a default system turn of another length).
    assert usage.input_tokens == chat.usage.prompt_tokens
    assert usage.output_tokens == chat.usage.completion_tokens
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details.cached_tokens == 0
    assert usage.output_tokens_details.reasoning_tokens == 0


def test_a_streamed_response_sends_its_typed_events_in_order(client: openai.OpenAI) -> None:
    fields: Any = {"model": SMOLLM, "input": QUESTION, "max_output_tokens": 16, "temperature": 0}
    whole = respond(client, **fields)
    events = list(respond(client, **fields, stream=True))
    kinds = [event.type for event in events]
    deltas = [event for event in events if event.type == "response.output_text.delta"]
    assert len(deltas) > 3
    assert [kind for kind in kinds if kind != "response.output_text.delta"] == [
        *TEXT_EVENTS,
        f"response.{whole.status}",
    ]
    assert kinds[4 : 4 + len(deltas)] == ["response.output_text.delta"] * len(deltas)
    assert [event.sequence_number for event in events] == list(range(len(events)))
    text = "".join(delta.delta for delta in deltas)
    assert text == whole.output_text
    assert events[-4].text == text  # output_text.done
    last = events[-1].response
    assert last.output_text == text
    assert last.usage.output_tokens == whole.usage.output_tokens


def test_max_output_tokens_leaves_the_response_incomplete(client: openai.OpenAI) -> None:
    response = respond(
        client, model=SMOLLM, input="Tell me a long story about a dragon.", max_output_tokens=5
    )
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 5
    assert response.output[0].status == "incomplete"


def test_text_format_json_schema_gives_json_that_validates(client: openai.OpenAI) -> None:
    response = respond(
        client,
        model=SMOLLM,
        input="Describe a person as JSON.",
        max_output_tokens=60,
        temperature=0,
        text={"format": {"type": "json_schema", "name": "person", "schema": PERSON}},
    )
    jsonschema.validate(json.loads(response.output_text), PERSON)
    assert response.text.format.type == "json_schema"


RESULT = '{"celsius": 21}'
WEATHER_QUESTION = {"role": "user", "content": "What is the weather in Paris?"}


@pytest.fixture(scope="module")
def forced_call(client: openai.OpenAI) -> Any:
    """A response that is a forced call of the weather tool."""
    return respond(
        client,
        model="hermes",
        input=[WEATHER_QUESTION],
        tools=[WEATHER],
        tool_choice="required",
        temperature=0,
    )


def answer_to(client: openai.OpenAI, call: Any, **fields: Any) -> Any:
    """The answer once the call's result is in, `fields` saying what came before it."""
    result = {"type": "function_call_output", "call_id": call.call_id, "output": RESULT}
    before = fields.pop("input", [])
    return respond(
        client,
        model="hermes",
        input=[*before, result],
        tools=[WEATHER],
        temperature=0,
        max_output_tokens=8,
        **fields,
    )


def test_a_function_call_and_its_output_round_trip(client: openai.OpenAI, forced_call: Any) -> None:
    assert forced_call.status == "completed"
    (call,) = forced_call.output
    assert (call.type, call.name, call.status) == ("function_call", "get_weather", "completed")
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    # The SDK's way: the output goes back in, and the result after it.
    answer = answer_to(client, call, input=[WEATHER_QUESTION, *forced_call.output])
    # The call and its result went back through the template: the prompt grew by them.
    assert answer.usage.input_tokens > forced_call.usage.input_tokens + 10


def test_previous_response_id_continues_the_kept_conversation(
    client: openai.OpenAI, forced_call: Any
) -> None:
    (call,) = forced_call.output
    whole = answer_to(client, call, input=[WEATHER_QUESTION, *forced_call.output])
    continued = answer_to(client, call, previous_response_id=forced_call.id)
    # The same prompt as the conversation sent whole, and so the same answer.
    assert continued.previous_response_id == forced_call.id
    assert continued.usage.input_tokens == whole.usage.input_tokens
    assert continued.output_text == whole.output_text


def test_a_named_function_streams_as_call_events(client: openai.OpenAI) -> None:
    events = list(
        respond(
            client,
            model="hermes",
            input="Weather in Rome?",
            tools=[WEATHER, CLOCK],
            tool_choice={"type": "function", "name": "get_time"},
            temperature=0,
            stream=True,
        )
    )
    assert [event.type for event in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    item = events[-2].item
    assert (item.type, item.name) == ("function_call", "get_time")
    jsonschema.validate(json.loads(events[4].arguments), CLOCK["parameters"])
    assert events[-1].response.output[0].call_id == item.call_id


def test_what_cannot_be_continued_or_served_is_a_400_saying_why(client: openai.OpenAI) -> None:
    unkept = respond(client, model=SMOLLM, input="Hi", max_output_tokens=1, store=False)
    with pytest.raises(openai.BadRequestError, match="only with `store` true"):
        respond(client, model=SMOLLM, input="And?", previous_response_id=unkept.id)
    with pytest.raises(openai.BadRequestError, match="built-in tools"):
        respond(client, model=SMOLLM, input="News?", tools=[{"type": "web_search"}])
    with pytest.raises(openai.BadRequestError, match="`background`"):
        respond(client, model=SMOLLM, input="Hi", background=True)
    with pytest.raises(openai.NotFoundError):
        respond(client, model="no-such-model", input="Hi")
    with pytest.raises(openai.BadRequestError) as overflow:  # past the 1,024-token context
        respond(client, model=SMOLLM, input="word " * 3000)
    assert overflow.value.code == "context_length_exceeded"
    assert overflow.value.param == "input"


def test_nulls_and_fields_it_does_not_know_are_ignored_and_named(base_url: str) -> None:
    body = {
        "model": SMOLLM,
        "input": "Hi",
        "max_output_tokens": 2,
        "instructions": None,
        "tools": None,
        "text": None,
        "reasoning": {"effort": "low"},
        "truncation": "auto",
        "some_future_field": {"a": 1},
    }
    reply = httpx.post(base_url + "/responses", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["output_tokens"] == 2
    assert reply.headers["x-ignored-fields"] == "reasoning, some_future_field, truncation"


def server_sent(reply: httpx.Response) -> list[dict[str, Any]]:
    """A stream's events, each checked to be named by its type."""
    events = []
    for block in reply.text.removesuffix("\n\n").split("\n\n"):
        name, data = block.split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert name == f"event: {event['type']}"
        events.append(event)
    return events


def test_what_goes_on_the_wire_validates_against_openai_s_schemas(base_url: str) -> None:
    body = {"model": SMOLLM, "input": QUESTION, "max_output_tokens": 4, "temperature": 0}
    schemas = event_schemas()
    with httpx.Client(base_url=base_url, timeout=120) as http:
        whole = http.post("/responses", json=body)
        openai_schema.validate(whole.json(), "Response")
        streamed = http.post("/responses", json={**body, "stream": True})
        assert streamed.headers["content-type"].startswith("text/event-stream")
        events = server_sent(streamed)
        for event in events:
            openai_schema.validate(event, schemas[event["type"]])
        (message,) = events[-1]["response"]["output"]
        assert message["content"] == whole.json()["output"][0]["content"]
        refused = http.post("/responses", json={**body, "tools": [{"type": "file_search"}]})
        assert refused.status_code == 400
        openai_schema.validate(refused.json(), "ErrorResponse")


def test_litellm_responses(base_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # litellm fetches its model price list at import unless told to use its own copy.
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    responses: Any = litellm.responses  # typed for every provider's answer
    response = responses(
        model=f"openai/{SMOLLM}",
        input=QUESTION,
        instructions="Answer briefly.",
        max_output_tokens=16,  # litellm raises less to 16, OpenAI's least
        temperature=0,
        api_base=base_url,
        api_key="none",
    )
    text = "".join(
        part.text for item in response.output if item.type == "message" for part in item.content
    )
    assert text
    assert response.usage.output_tokens <= 16
    chunks = list(
        responses(
            model=f"openai/{SMOLLM}",
            input=QUESTION,
            max_output_tokens=16,
            temperature=0,
            stream=True,
            api_base=base_url,
            api_key="none",
        )
    )
    streamed = "".join(c.delta for c in chunks if c.type == "response.output_text.delta")
    assert streamed
    assert chunks[-1].type in ("response.completed", "response.incomplete")


def test_langchain_chat_openai_over_the_responses_api(base_url: str) -> None:
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        return "sunny"

    def model(name: str) -> ChatOpenAI:
        return ChatOpenAI(
            model=name,
            base_url=base_url,
            api_key="none",  # type: ignore[arg-type]
            use_responses_api=True,
            temperature=0,
            max_retries=0,
        )

    answer = model(SMOLLM).bind(max_output_tokens=8).invoke(QUESTION)
    assert answer.text
    called = model("hermes").bind_tools([get_weather], tool_choice="any").invoke("Paris?")
    (call,) = called.tool_calls
    assert call["name"] == "get_weather"
    assert isinstance(call["args"]["city"], str)
