# ruff: noqa: E501  (a real chat template, kept byte for byte)
"""Tools, tool calls and tool results reach chat templates as transformers passes them."""

from __future__ import annotations

import json

from service.text.chat_template import render_chat
from service.text.requests import ChatMessage, Tool, ToolCall

# The chat template of Qwen2.5-Instruct (Hermes-style tool calls), as in its
# tokenizer_config.json.
QWEN25_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

WEATHER = Tool(
    name="get_weather",
    description="The current weather in a city (<city> is its name).",
    parameters_json=json.dumps(
        {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    ),
)
CONVERSATION = (
    ChatMessage("user", "What is the weather in Paris?"),
    ChatMessage(
        "assistant", "", tool_calls=(ToolCall("call_1", "get_weather", '{"city": "Paris"}'),)
    ),
    ChatMessage("tool", '{"sky": "clear", "celsius": 21}', tool_call_id="call_1"),
)


def test_a_hermes_template_shows_the_tool_signature_the_call_and_the_result() -> None:
    prompt = render_chat(QWEN25_TEMPLATE, CONVERSATION, {}, "qwen", tools=(WEATHER,))
    signature = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city (<city> is its name).",
            "parameters": json.loads(WEATHER.parameters_json),
        },
    }
    tools_block = prompt.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0]
    assert json.loads(tools_block) == signature
    # As transformers renders it: keys in order, "<" not HTML-escaped.
    assert "(<city> is its name)" in tools_block
    assert tools_block.startswith('{"type": "function", "function": {"name": "get_weather"')
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in (
        prompt
    )
    assert (
        '<|im_start|>user\n<tool_response>\n{"sky": "clear", "celsius": 21}\n</tool_response>'
        "<|im_end|>\n<|im_start|>assistant\n"
    ) in prompt
    assert prompt.endswith("<|im_start|>assistant\n")


def test_without_tools_the_template_takes_its_plain_branch() -> None:
    prompt = render_chat(QWEN25_TEMPLATE, CONVERSATION[:1], {}, "qwen")
    assert "# Tools" not in prompt
    assert prompt.startswith("<|im_start|>system\nYou are Qwen")


def test_a_template_that_ignores_tools_still_renders() -> None:
    template = (
        "{% for m in messages %}<start_of_turn>{{ m.role }}\n{{ m.content }}<end_of_turn>\n"
        "{% endfor %}<start_of_turn>model\n"
    )
    prompt = render_chat(template, CONVERSATION, {}, "gemma", tools=(WEATHER,))
    assert prompt.startswith("<start_of_turn>user\nWhat is the weather in Paris?<end_of_turn>")
    assert '<start_of_turn>tool\n{"sky": "clear", "celsius": 21}<end_of_turn>' in prompt
