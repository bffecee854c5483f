"""What a text generation request asks for and what its stream reports.

These dataclasses own their conversion from and to protobuf, so the servicer
stays a thin adapter and the decode loop never touches protobuf types.
"""

from __future__ import annotations

import enum
import json
import math
import random
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from inference.v1 import inference_pb2 as pb
from service.errors import InvalidRequest, excerpt

MAX_STOP_SEQUENCES = 16
MAX_STOP_SEQUENCE_CHARS = 256
MAX_TOOLS = 128
MAX_TOOL_PARAMETERS_CHARS = 64 * 1024
# JSON the server parses (tool schemas, call arguments) and hands to templates:
# deeper documents are refused rather than recursing into RecursionError.
MAX_JSON_DEPTH = 64
MAX_ROLE_CHARS = 64
# Sampling ranges: beyond MAX_TEMPERATURE the distribution is all but uniform,
# and repetition penalties past MAX_REPEAT_PENALTY only ever pick the rarest tokens.
MAX_TEMPERATURE = 2.0
MAX_REPEAT_PENALTY = 10.0
# Presence and frequency penalties: OpenAI's range.
MAX_ADDITIVE_PENALTY = 2.0
# logit_bias: OpenAI's range of a bias, and a bound on how many tokens one request biases.
MAX_LOGIT_BIAS = 100.0
MAX_LOGIT_BIAS_TOKENS = 1024
_FRACTIONS = ("temperature", "top_p", "min_p")
_PROMPTS = ("prompt", "messages", "prompt_token_ids")
_ADDITIVE_PENALTIES = ("presence_penalty", "frequency_penalty")
# The function names OpenAI-style clients allow; every tool-call convention we
# parse can write them (FunctionGemma's needs an identifier, hence no dots).
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")

T = TypeVar("T")


def _pick(value: T | None, default: T) -> T:
    return default if value is None else value


def _json_object(text: str, what: str) -> dict[str, Any]:
    """`text` parsed as a JSON object, or InvalidRequest naming `what`."""
    try:
        value = json.loads(text)
    except ValueError as exc:  # JSONDecodeError, or an integer of 4,300 digits and more
        raise InvalidRequest(f"{what} is not valid JSON: {exc}") from exc
    except RecursionError:
        raise InvalidRequest(f"{what} nests deeper than {MAX_JSON_DEPTH} levels") from None
    if not isinstance(value, dict):
        raise InvalidRequest(f"{what} must be a JSON object, got {type(value).__name__}")
    if json_depth(value) > MAX_JSON_DEPTH:
        raise InvalidRequest(f"{what} nests deeper than {MAX_JSON_DEPTH} levels")
    return value


def json_depth(value: object) -> int:
    """How deeply a parsed JSON value nests (a scalar is 0), without recursing."""
    deepest = 0
    pending = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        deepest = max(deepest, depth)
        if isinstance(item, dict):
            pending.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list):
            pending.extend((child, depth + 1) for child in item)
    return deepest


@dataclass(frozen=True)
class ToolCall:
    """A call the model made: `arguments_json` is the text of a JSON object."""

    id: str
    name: str
    arguments_json: str

    @classmethod
    def from_pb(cls, msg: pb.ToolCall) -> ToolCall:
        return cls(id=msg.id, name=msg.name, arguments_json=msg.arguments_json)

    def to_pb(self) -> pb.ToolCall:
        return pb.ToolCall(id=self.id, name=self.name, arguments_json=self.arguments_json)

    def arguments(self) -> dict[str, Any]:
        what = f"arguments of tool call {excerpt(self.name)}"
        return _json_object(self.arguments_json or "{}", what)


@dataclass(frozen=True)
class Tool:
    """A function offered to the model; `parameters_json` is a JSON Schema object."""

    name: str
    description: str = ""
    parameters_json: str = ""

    @classmethod
    def from_pb(cls, msg: pb.Tool) -> Tool:
        return cls(name=msg.name, description=msg.description, parameters_json=msg.parameters_json)

    def to_pb(self) -> pb.Tool:
        return pb.Tool(
            name=self.name, description=self.description, parameters_json=self.parameters_json
        )

    def parameters(self) -> dict[str, Any]:
        """The JSON schema of the arguments; no parameters is an empty object schema."""
        if not self.parameters_json.strip():
            return {"type": "object", "properties": {}}
        return _json_object(self.parameters_json, f"parameters_json of tool {excerpt(self.name)}")

    def validate(self, index: int) -> None:
        if not self.name:
            raise InvalidRequest(f"tools[{index}] has no name")
        if not TOOL_NAME.fullmatch(self.name):
            raise InvalidRequest(
                f"tools[{index}] name {excerpt(self.name)} must be 1 to 64 letters, digits, "
                "underscores or hyphens"
            )
        if len(self.parameters_json) > MAX_TOOL_PARAMETERS_CHARS:
            raise InvalidRequest(
                f"tools[{index}] parameters_json is limited to {MAX_TOOL_PARAMETERS_CHARS} "
                "characters"
            )
        self.parameters()


@dataclass(frozen=True)
class ToolChoice:
    """A call the model must make: of the tool `name`, or of any tool when it is empty."""

    name: str = ""
    parallel_calls: bool = False

    @classmethod
    def from_pb(cls, msg: pb.ToolChoice) -> ToolChoice:
        return cls(name=msg.name, parallel_calls=msg.parallel_calls)

    def to_pb(self) -> pb.ToolChoice:
        return pb.ToolChoice(name=self.name, parallel_calls=self.parallel_calls)

    def tools(self, offered: tuple[Tool, ...]) -> tuple[Tool, ...]:
        """The tools a call may be of."""
        return tuple(tool for tool in offered if not self.name or tool.name == self.name)


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str
    # An assistant turn's calls; a tool turn's answer to one of them.
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""
    name: str = ""

    @classmethod
    def from_pb(cls, msg: pb.ChatMessage) -> ChatMessage:
        return cls(
            role=msg.role,
            content=msg.content,
            tool_calls=tuple(ToolCall.from_pb(call) for call in msg.tool_calls),
            tool_call_id=msg.tool_call_id,
            name=msg.name,
        )

    def to_pb(self) -> pb.ChatMessage:
        return pb.ChatMessage(
            role=self.role,
            content=self.content,
            tool_calls=[call.to_pb() for call in self.tool_calls],
            tool_call_id=self.tool_call_id,
            name=self.name,
        )

    def validate(self, index: int) -> None:
        if not self.role:
            raise InvalidRequest(f"messages[{index}] has no role")
        if len(self.role) > MAX_ROLE_CHARS:
            raise InvalidRequest(
                f"messages[{index}] role is {len(self.role)} characters; a role is at most "
                f"{MAX_ROLE_CHARS} (system, user, assistant, tool, ...)"
            )
        if self.tool_calls and self.role != "assistant":
            raise InvalidRequest(
                f"messages[{index}] has tool_calls, which only an assistant turn can make"
            )
        for call in self.tool_calls:
            if not call.name:
                raise InvalidRequest(f"messages[{index}] has a tool call without a name")
            call.arguments()


@dataclass(frozen=True)
class GenerationLimits:
    """Server settings that bound what a request may ask for."""

    max_top_logprobs: int = 20


@dataclass(frozen=True)
class SamplingParams:
    """Fully resolved sampling parameters, as a backend applies them."""

    temperature: float
    top_p: float
    top_k: int
    min_p: float
    repeat_penalty: float
    seed: int
    # Subtracted from the logits of recent tokens: once each, and once per occurrence.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # (token id, bias) pairs added to the logits before anything else (llama.cpp's chain).
    logit_bias: tuple[tuple[int, float], ...] = ()

    @property
    def penalized(self) -> bool:
        """Whether any penalty on recent tokens applies."""
        return (
            self.repeat_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
        )


@dataclass(frozen=True)
class SamplingDefaults:
    """A model's own defaults; the seed is drawn per request."""

    temperature: float = 0.8
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0


@dataclass(frozen=True)
class SamplingOverrides:
    """What the client set; None means "use the model's default"."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    # (token id, bias) pairs, ids ascending; empty: none. Not a default of the model's.
    logit_bias: tuple[tuple[int, float], ...] = ()

    def resolve(self, defaults: SamplingDefaults) -> SamplingParams:
        return SamplingParams(
            temperature=_pick(self.temperature, defaults.temperature),
            top_p=_pick(self.top_p, defaults.top_p),
            top_k=_pick(self.top_k, defaults.top_k),
            min_p=_pick(self.min_p, defaults.min_p),
            repeat_penalty=_pick(self.repeat_penalty, defaults.repeat_penalty),
            seed=_pick(self.seed, random.randrange(2**32)),
            presence_penalty=_pick(self.presence_penalty, defaults.presence_penalty),
            frequency_penalty=_pick(self.frequency_penalty, defaults.frequency_penalty),
            logit_bias=self.logit_bias,
        )

    def validate(self) -> None:
        for name in (*_FRACTIONS, "repeat_penalty", *_ADDITIVE_PENALTIES):
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                raise InvalidRequest(f"{name} must be a finite number, got {value}")
        if self.temperature is not None and not 0 <= self.temperature <= MAX_TEMPERATURE:
            raise InvalidRequest(
                f"temperature must be in [0, {MAX_TEMPERATURE:g}] (0 is greedy), "
                f"got {self.temperature}"
            )
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise InvalidRequest(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k is not None and self.top_k < 0:
            raise InvalidRequest(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if self.min_p is not None and not 0 <= self.min_p <= 1:
            raise InvalidRequest(f"min_p must be in [0, 1], got {self.min_p}")
        penalty = self.repeat_penalty
        if penalty is not None and not 0 < penalty <= MAX_REPEAT_PENALTY:
            raise InvalidRequest(
                f"repeat_penalty must be in (0, {MAX_REPEAT_PENALTY:g}] (1 is off), got {penalty}"
            )
        for name in _ADDITIVE_PENALTIES:
            value = getattr(self, name)
            if value is not None and not -MAX_ADDITIVE_PENALTY <= value <= MAX_ADDITIVE_PENALTY:
                raise InvalidRequest(
                    f"{name} must be in [-{MAX_ADDITIVE_PENALTY:g}, {MAX_ADDITIVE_PENALTY:g}] "
                    f"(0 is off), got {value}"
                )
        self._validate_logit_bias()

    def _validate_logit_bias(self) -> None:
        """The biases' count and range; the ids against the vocabulary are the engine's
        to check (`check_token_ids`), which knows the model."""
        if len(self.logit_bias) > MAX_LOGIT_BIAS_TOKENS:
            raise InvalidRequest(
                f"logit_bias may bias at most {MAX_LOGIT_BIAS_TOKENS} tokens, "
                f"got {len(self.logit_bias)}",
                param="logit_bias",
            )
        for token, bias in self.logit_bias:
            if token < 0:
                raise InvalidRequest(
                    f"logit_bias names token id {token}; ids are 0 or more", param="logit_bias"
                )
            if not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:  # NaN too
                raise InvalidRequest(
                    f"logit_bias of token {token} must be in [-{MAX_LOGIT_BIAS:g}, "
                    f"{MAX_LOGIT_BIAS:g}], got {bias}",
                    param="logit_bias",
                )


def check_token_ids(ids: Iterable[int], vocabulary: int, field: str) -> None:
    """InvalidRequest naming the first id of `ids` outside a vocabulary of `vocabulary`
    tokens, and `field` as the request's field at fault."""
    for token in ids:
        if not 0 <= token < vocabulary:
            raise InvalidRequest(
                f"{field} names token id {token}; this model's vocabulary has ids 0 to "
                f"{vocabulary - 1}",
                param=field,
            )


@dataclass(frozen=True)
class Grammar:
    """GBNF text every sampled token must fit, checked against the server's bounds.

    `branches` is the most parser stacks one position of it can lead to:
    llama.cpp checks each against every token of the vocabulary, so with the
    model's vocabulary it says what sampling one token costs.
    """

    text: str
    branches: int = 1


@dataclass(frozen=True)
class GenerationRequest:
    model: str
    prompt: str | None
    messages: tuple[ChatMessage, ...]
    max_tokens: int | None
    stop: tuple[str, ...]
    sampling: SamplingOverrides
    tools: tuple[Tool, ...] = ()
    # The grammar constraining the output: the request's `grammar`, or one built
    # from `response_format.json_schema`; checked. None: unconstrained.
    grammar: Grammar | None = None
    logprobs: bool = False
    # Alternatives to report per token; 0 when none (or logprobs is off).
    top_logprobs: int = 0
    # Set when a tool call is forced; the engine builds its grammar.
    tool_choice: ToolChoice | None = None
    # A prompt of token ids, fed as they are (then prompt is None and messages empty).
    prompt_token_ids: tuple[int, ...] = ()

    @classmethod
    def from_pb(
        cls,
        msg: pb.GenerateRequest,
        limits: GenerationLimits | None = None,
        *,
        grammar: Grammar | None = None,
    ) -> GenerationRequest:
        """The request in `msg`, validated. `grammar` is what `msg`'s grammar or JSON
        schema compiled to: `service.front.conversion` compiles it (that needs llama.cpp),
        and an engine process gets it compiled from the front."""
        if grammar is None and (msg.HasField("grammar") or msg.response_format.json_schema):
            raise ValueError("compile the request's grammar first (service.front.conversion)")

        def optional(name: str) -> float | int | None:
            return getattr(msg, name) if msg.HasField(name) else None

        request = cls(
            model=msg.model,
            prompt=msg.prompt or None,
            messages=tuple(ChatMessage.from_pb(m) for m in msg.messages),
            max_tokens=msg.max_tokens if msg.HasField("max_tokens") else None,
            stop=tuple(msg.stop),
            sampling=SamplingOverrides(
                temperature=optional("temperature"),
                top_p=optional("top_p"),
                top_k=msg.top_k if msg.HasField("top_k") else None,
                min_p=optional("min_p"),
                repeat_penalty=optional("repeat_penalty"),
                seed=msg.seed if msg.HasField("seed") else None,
                presence_penalty=optional("presence_penalty"),
                frequency_penalty=optional("frequency_penalty"),
                logit_bias=tuple(sorted(msg.logit_bias.items())),
            ),
            tools=tuple(Tool.from_pb(tool) for tool in msg.tools),
            grammar=grammar,
            logprobs=msg.logprobs,
            top_logprobs=msg.top_logprobs,
            tool_choice=(
                ToolChoice.from_pb(msg.tool_choice) if msg.HasField("tool_choice") else None
            ),
            prompt_token_ids=tuple(msg.prompt_token_ids),
        )
        if msg.HasField("top_logprobs") and msg.top_logprobs and not msg.logprobs:
            raise InvalidRequest("top_logprobs needs logprobs to be set")
        request.validate(limits or GenerationLimits())
        return request

    def validate(self, limits: GenerationLimits | None = None) -> None:
        limits = limits or GenerationLimits()
        set_ = (self.prompt is not None, bool(self.messages), bool(self.prompt_token_ids))
        given = [name for name, is_set in zip(_PROMPTS, set_, strict=True) if is_set]
        if len(given) > 1:
            raise InvalidRequest(f"set either `{given[0]}` or `{given[1]}`, not both")
        if not given:
            raise InvalidRequest("the request needs a non-empty `prompt` or `messages`")
        if any(token < 0 for token in self.prompt_token_ids):
            raise InvalidRequest("prompt_token_ids must be 0 or more", param="prompt")
        for index, message in enumerate(self.messages):
            message.validate(index)
        if self.max_tokens is not None and self.max_tokens < 1:
            raise InvalidRequest(f"max_tokens must be at least 1, got {self.max_tokens}")
        self._validate_stop()
        self.sampling.validate()
        self._validate_tools()
        if self.top_logprobs > limits.max_top_logprobs:
            raise InvalidRequest(
                f"top_logprobs is limited to {limits.max_top_logprobs} on this server, "
                f"got {self.top_logprobs}"
            )

    def _validate_tools(self) -> None:
        if len(self.tools) > MAX_TOOLS:
            raise InvalidRequest(f"at most {MAX_TOOLS} tools, got {len(self.tools)}")
        seen: set[str] = set()
        for index, tool in enumerate(self.tools):
            tool.validate(index)
            if tool.name in seen:
                raise InvalidRequest(f"tools[{index}] repeats the name {excerpt(tool.name)}")
            seen.add(tool.name)
        if self.tool_choice is not None:
            self._validate_tool_choice(self.tool_choice, seen)

    def _validate_tool_choice(self, choice: ToolChoice, names: set[str]) -> None:
        if not names:
            raise InvalidRequest("tool_choice forces a tool call: the request needs `tools`")
        if choice.name and choice.name not in names:
            raise InvalidRequest(
                f"tool_choice names {excerpt(choice.name)}, which is not one of the request's "
                f"tools ({', '.join(sorted(names))})"
            )
        if self.grammar is not None:
            raise InvalidRequest(
                "tool_choice constrains the output to tool calls itself: leave out `grammar` "
                "and `response_format`"
            )

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


def tokenize_request(msg: pb.TokenizeRequest) -> GenerationRequest:
    """What a TokenizeRequest asks to tokenize, validated as the prompt of a
    GenerationRequest is (its messages and tools); an empty prompt is allowed."""
    request = GenerationRequest(
        model=msg.model,
        prompt=None if msg.messages else msg.prompt,
        messages=tuple(ChatMessage.from_pb(m) for m in msg.messages),
        max_tokens=None,
        stop=(),
        sampling=SamplingOverrides(),
        tools=tuple(Tool.from_pb(tool) for tool in msg.tools),
    )
    for index, message in enumerate(request.messages):
        message.validate(index)
    request._validate_tools()
    return request


class FinishReason(enum.Enum):
    END_OF_TURN = pb.FINISH_REASON_END_OF_TURN
    STOP_SEQUENCE = pb.FINISH_REASON_STOP_SEQUENCE
    LENGTH = pb.FINISH_REASON_LENGTH
    TIME_LIMIT = pb.FINISH_REASON_TIME_LIMIT
    TOOL_CALL = pb.FINISH_REASON_TOOL_CALL

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
class TopLogprob:
    token_id: int
    # Bytes: a token may hold part of a UTF-8 character.
    token: bytes
    logprob: float

    def to_pb(self) -> pb.TopLogprob:
        return pb.TopLogprob(token_id=self.token_id, token=self.token, logprob=self.logprob)


@dataclass(frozen=True)
class TokenLogprob:
    """The log-probability of one generated token and, if asked, its top alternatives."""

    token_id: int
    token: bytes
    logprob: float
    top_logprobs: tuple[TopLogprob, ...] = ()

    def to_pb(self) -> pb.TokenLogprob:
        return pb.TokenLogprob(
            token_id=self.token_id,
            token=self.token,
            logprob=self.logprob,
            top_logprobs=[top.to_pb() for top in self.top_logprobs],
        )


@dataclass(frozen=True)
class Delta:
    text: str
    token_ids: tuple[int, ...]
    # One per token in token_ids when the request asked for logprobs; else empty.
    logprobs: tuple[TokenLogprob, ...] = ()

    def to_pb(self) -> pb.GenerateResponse:
        return pb.GenerateResponse(
            delta=pb.TextDelta(
                text=self.text,
                token_ids=self.token_ids,
                logprobs=[entry.to_pb() for entry in self.logprobs],
            )
        )


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int
    sampled_in_graph_tokens: int = 0

    def to_pb(self) -> pb.Usage:
        return pb.Usage(
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            cached_prompt_tokens=self.cached_prompt_tokens,
            sampled_in_graph_tokens=self.sampled_in_graph_tokens,
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
    # Set when the request had tools: see service.tools.with_tool_calls.
    tool_calls: tuple[ToolCall, ...] = ()
    content: str = ""
    tool_call_errors: tuple[str, ...] = ()

    def to_pb(self) -> pb.GenerateResponse:
        return pb.GenerateResponse(
            finished=pb.GenerationFinished(
                finish_reason=self.finish_reason.value,
                stop_sequence=self.stop_sequence,
                usage=self.usage.to_pb(),
                timing=self.timing.to_pb(),
                seed=self.seed,
                tool_calls=[call.to_pb() for call in self.tool_calls],
                content=self.content,
                tool_call_errors=self.tool_call_errors,
            )
        )
