"""Per-request limits from settings: prompt size, max_tokens, message count.

Checked on the protobuf message as it arrived, before it is converted, waits
for a slot or touches a model, so an oversized request costs next to nothing
and is told INVALID_ARGUMENT with the limit it crossed.
"""

from __future__ import annotations

from dataclasses import dataclass

from inference.v1 import inference_pb2 as pb
from service.config import LimitSettings
from service.errors import InvalidRequest

# Fixed bounds on the parts of a request the prompt limit does not see whole: each is
# far past what a real request sends, and each check costs nothing.
MAX_TOOL_DESCRIPTION_CHARS = 16 * 1024
MAX_TOOL_CALLS_PER_MESSAGE = 128
MAX_NAME_CHARS = 256  # a message's name, a tool call's id and name


@dataclass(frozen=True)
class RequestLimits:
    max_prompt_bytes: int
    max_tokens: int
    max_messages: int

    @classmethod
    def from_settings(cls, settings: LimitSettings) -> RequestLimits:
        return cls(
            max_prompt_bytes=int(settings.max_prompt_bytes),
            max_tokens=settings.max_tokens_cap,
            max_messages=settings.max_messages,
        )

    def check(self, request: pb.GenerateRequest) -> None:
        # The count first: it costs nothing, while measuring a million messages would not.
        if len(request.messages) > self.max_messages:
            raise InvalidRequest(
                f"at most {self.max_messages} messages per request, got {len(request.messages)}"
            )
        _check_tools(request)
        size = _prompt_bytes(request, self.max_prompt_bytes)
        if size > self.max_prompt_bytes:
            raise InvalidRequest(
                f"the prompt is {size} bytes or more; this server takes at most "
                f"{self.max_prompt_bytes}"
            )
        if request.HasField("max_tokens") and request.max_tokens > self.max_tokens:
            raise InvalidRequest(
                f"max_tokens is at most {self.max_tokens} on this server, got {request.max_tokens}"
            )


def _check_tools(request: pb.GenerateRequest) -> None:
    """Tool descriptions, names, ids and calls per message: bounded one by one."""
    for index, tool in enumerate(request.tools):
        if len(tool.description) > MAX_TOOL_DESCRIPTION_CHARS:
            raise InvalidRequest(
                f"tools[{index}] description is {len(tool.description)} characters; at most "
                f"{MAX_TOOL_DESCRIPTION_CHARS}"
            )
    for index, message in enumerate(request.messages):
        if len(message.tool_calls) > MAX_TOOL_CALLS_PER_MESSAGE:
            raise InvalidRequest(
                f"messages[{index}] has {len(message.tool_calls)} tool calls; at most "
                f"{MAX_TOOL_CALLS_PER_MESSAGE}"
            )
        names = [message.name, message.tool_call_id]
        names += [text for call in message.tool_calls for text in (call.id, call.name)]
        if any(len(name) > MAX_NAME_CHARS for name in names):
            raise InvalidRequest(
                f"messages[{index}]: a name, tool call id or tool name is over "
                f"{MAX_NAME_CHARS} characters"
            )


def _prompt_bytes(request: pb.GenerateRequest, limit: int) -> int:
    """UTF-8 bytes of the prompt (its token ids), or of every message's text, tool calls
    included, and the tools' descriptions and schemas: all of it reaches the template.

    A text has at least as many bytes as characters, so texts with more
    characters than `limit` are over it without being encoded: the character
    count is returned then.
    """
    texts = [request.prompt]
    for message in request.messages:
        texts += [message.role, message.content, message.name, message.tool_call_id]
        texts += [call.arguments_json for call in message.tool_calls]
    for tool in request.tools:
        texts += [tool.description, tool.parameters_json]
    # A prompt of token ids counts 4 bytes an id, about what a token's text takes.
    ids = 4 * len(request.prompt_token_ids)
    characters = sum(map(len, texts)) + ids
    if characters > limit:
        return characters
    return sum(len(text.encode()) for text in texts) + ids
