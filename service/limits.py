"""Per-request limits from settings: prompt size, max_tokens, message count.

Checked before a request waits for a slot or a model, so an oversized request
costs nothing and is told INVALID_ARGUMENT with the limit it crossed.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.config import Settings
from service.errors import InvalidRequest
from service.generation import GenerationRequest


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

    def check(self, request: GenerationRequest) -> None:
        if len(request.messages) > self.max_messages:
            raise InvalidRequest(
                f"at most {self.max_messages} messages per request, got {len(request.messages)}"
            )
        size = prompt_bytes(request)
        if size > self.max_prompt_bytes:
            raise InvalidRequest(
                f"the prompt is {size} bytes; this server takes at most {self.max_prompt_bytes}"
            )
        if request.max_tokens is not None and request.max_tokens > self.max_tokens:
            raise InvalidRequest(
                f"max_tokens is at most {self.max_tokens} on this server, got {request.max_tokens}"
            )


def prompt_bytes(request: GenerationRequest) -> int:
    """UTF-8 bytes of the prompt, or of every message's role and content."""
    if request.prompt is not None:
        return len(request.prompt.encode())
    return sum(len(m.role.encode()) + len(m.content.encode()) for m in request.messages)
