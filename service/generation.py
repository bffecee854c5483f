"""What a text generation request asks for and what its stream reports.

These dataclasses own their conversion from and to protobuf, so the servicer
stays a thin adapter and the decode loop never touches protobuf types.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass
from typing import TypeVar

from inference.v1 import inference_pb2 as pb
from service.errors import InvalidRequest

MAX_STOP_SEQUENCES = 16
MAX_STOP_SEQUENCE_CHARS = 256

T = TypeVar("T")


def _pick(value: T | None, default: T) -> T:
    return default if value is None else value


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str


@dataclass(frozen=True)
class SamplingParams:
    """Fully resolved sampling parameters, as a backend applies them."""

    temperature: float
    top_p: float
    top_k: int
    min_p: float
    repeat_penalty: float
    seed: int


@dataclass(frozen=True)
class SamplingDefaults:
    """A model's own defaults; the seed is drawn per request."""

    temperature: float = 0.8
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    repeat_penalty: float = 1.0


@dataclass(frozen=True)
class SamplingOverrides:
    """What the client set; None means "use the model's default"."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    seed: int | None = None

    def resolve(self, defaults: SamplingDefaults) -> SamplingParams:
        return SamplingParams(
            temperature=_pick(self.temperature, defaults.temperature),
            top_p=_pick(self.top_p, defaults.top_p),
            top_k=_pick(self.top_k, defaults.top_k),
            min_p=_pick(self.min_p, defaults.min_p),
            repeat_penalty=_pick(self.repeat_penalty, defaults.repeat_penalty),
            seed=_pick(self.seed, random.randrange(2**32)),
        )

    def validate(self) -> None:
        if self.temperature is not None and not self.temperature >= 0:
            raise InvalidRequest(f"temperature must be >= 0, got {self.temperature}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise InvalidRequest(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k is not None and self.top_k < 0:
            raise InvalidRequest(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if self.min_p is not None and not 0 <= self.min_p <= 1:
            raise InvalidRequest(f"min_p must be in [0, 1], got {self.min_p}")
        if self.repeat_penalty is not None and not self.repeat_penalty > 0:
            raise InvalidRequest(f"repeat_penalty must be > 0, got {self.repeat_penalty}")


@dataclass(frozen=True)
class GenerationRequest:
    model: str
    prompt: str | None
    messages: tuple[ChatMessage, ...]
    max_tokens: int | None
    stop: tuple[str, ...]
    sampling: SamplingOverrides

    @classmethod
    def from_pb(cls, msg: pb.GenerateRequest) -> GenerationRequest:
        def optional(name: str) -> float | int | None:
            return getattr(msg, name) if msg.HasField(name) else None

        request = cls(
            model=msg.model,
            prompt=msg.prompt or None,
            messages=tuple(ChatMessage(m.role, m.content) for m in msg.messages),
            max_tokens=msg.max_tokens if msg.HasField("max_tokens") else None,
            stop=tuple(msg.stop),
            sampling=SamplingOverrides(
                temperature=optional("temperature"),
                top_p=optional("top_p"),
                top_k=msg.top_k if msg.HasField("top_k") else None,
                min_p=optional("min_p"),
                repeat_penalty=optional("repeat_penalty"),
                seed=msg.seed if msg.HasField("seed") else None,
            ),
        )
        request.validate()
        return request

    def validate(self) -> None:
        if self.prompt is not None and self.messages:
            raise InvalidRequest("set either `prompt` or `messages`, not both")
        if self.prompt is None and not self.messages:
            raise InvalidRequest("the request needs a non-empty `prompt` or `messages`")
        for index, message in enumerate(self.messages):
            if not message.role:
                raise InvalidRequest(f"messages[{index}] has no role")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise InvalidRequest(f"max_tokens must be at least 1, got {self.max_tokens}")
        self._validate_stop()
        self.sampling.validate()

    def _validate_stop(self) -> None:
        if len(self.stop) > MAX_STOP_SEQUENCES:
            raise InvalidRequest(
                f"at most {MAX_STOP_SEQUENCES} stop sequences, got {len(self.stop)}"
            )
        for sequence in self.stop:
            if not sequence:
                raise InvalidRequest("stop sequences must not be empty strings")
            if len(sequence) > MAX_STOP_SEQUENCE_CHARS:
                raise InvalidRequest(
                    f"stop sequences are limited to {MAX_STOP_SEQUENCE_CHARS} characters"
                )


class FinishReason(enum.Enum):
    END_OF_TURN = pb.FINISH_REASON_END_OF_TURN
    STOP_SEQUENCE = pb.FINISH_REASON_STOP_SEQUENCE
    LENGTH = pb.FINISH_REASON_LENGTH
    TIME_LIMIT = pb.FINISH_REASON_TIME_LIMIT

    @property
    def label(self) -> str:
        return self.name.lower()


@dataclass(frozen=True)
class Started:
    model: str
    backend: str
    prompt_tokens: int
    context_length: int

    def to_pb(self) -> pb.GenerateResponse:
        return pb.GenerateResponse(
            started=pb.GenerationStarted(
                model=self.model,
                backend=self.backend,
                prompt_tokens=self.prompt_tokens,
                context_length=self.context_length,
            )
        )


@dataclass(frozen=True)
class Delta:
    text: str
    token_ids: tuple[int, ...]

    def to_pb(self) -> pb.GenerateResponse:
        return pb.GenerateResponse(delta=pb.TextDelta(text=self.text, token_ids=self.token_ids))


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int

    def to_pb(self) -> pb.Usage:
        return pb.Usage(
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            cached_prompt_tokens=self.cached_prompt_tokens,
        )


@dataclass(frozen=True)
class Timing:
    ttft_ms: float
    decode_tokens_per_second: float
    total_ms: float
    queue_ms: float = 0.0

    def to_pb(self) -> pb.Timing:
        return pb.Timing(
            ttft_ms=self.ttft_ms,
            decode_tokens_per_second=self.decode_tokens_per_second,
            total_ms=self.total_ms,
            queue_ms=self.queue_ms,
        )


@dataclass(frozen=True)
class Finished:
    finish_reason: FinishReason
    usage: Usage
    timing: Timing
    seed: int
    stop_sequence: str = ""

    def to_pb(self) -> pb.GenerateResponse:
        return pb.GenerateResponse(
            finished=pb.GenerationFinished(
                finish_reason=self.finish_reason.value,
                stop_sequence=self.stop_sequence,
                usage=self.usage.to_pb(),
                timing=self.timing.to_pb(),
                seed=self.seed,
            )
        )


GenerationEvent = Started | Delta | Finished
