"""Per-request limits from settings: prompt size, max_tokens, message count.

Checked on the protobuf message as it arrived, before it is converted, waits
for a slot or touches a model, so an oversized request costs next to nothing
and is told INVALID_ARGUMENT with the limit it crossed.
"""

from __future__ import annotations

from dataclasses import dataclass

from inference.v1 import inference_pb2 as pb
from service.config import Settings
from service.errors import InvalidRequest


@dataclass(frozen=True)
class RequestLimits:
    max_prompt_bytes: int
    max_tokens: int
    max_messages: int

    @classmethod
    def from_settings(cls, settings: Settings) -> RequestLimits:
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


def _prompt_bytes(request: pb.GenerateRequest, limit: int) -> int:
    """UTF-8 bytes of the prompt, or of every message's role and content.

    A text has at least as many bytes as characters, so texts with more
    characters than `limit` are over it without being encoded: the character
    count is returned then.
    """
    texts = [request.prompt] + [text for m in request.messages for text in (m.role, m.content)]
    characters = sum(map(len, texts))
    if characters > limit:
        return characters
    return sum(len(text.encode()) for text in texts)
