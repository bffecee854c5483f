from google.api import annotations_pb2 as _annotations_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Capability(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CAPABILITY_UNSPECIFIED: _ClassVar[Capability]
    CAPABILITY_TEXT: _ClassVar[Capability]
    CAPABILITY_IMAGE: _ClassVar[Capability]
    CAPABILITY_EMBED: _ClassVar[Capability]

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_END_OF_TURN: _ClassVar[FinishReason]
    FINISH_REASON_STOP_SEQUENCE: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_TIME_LIMIT: _ClassVar[FinishReason]
    FINISH_REASON_TOOL_CALL: _ClassVar[FinishReason]

class QuantizationScheme(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    QUANTIZATION_SCHEME_UNSPECIFIED: _ClassVar[QuantizationScheme]
    QUANTIZATION_SCHEME_UNQUANTIZED: _ClassVar[QuantizationScheme]
    QUANTIZATION_SCHEME_AFFINE_GROUP_INT: _ClassVar[QuantizationScheme]
    QUANTIZATION_SCHEME_BLOCK_SCALED_FLOAT: _ClassVar[QuantizationScheme]
    QUANTIZATION_SCHEME_GGUF_K_QUANT: _ClassVar[QuantizationScheme]
    QUANTIZATION_SCHEME_GGUF_BLOCK: _ClassVar[QuantizationScheme]
    QUANTIZATION_SCHEME_UNKNOWN_METHOD: _ClassVar[QuantizationScheme]
CAPABILITY_UNSPECIFIED: Capability
CAPABILITY_TEXT: Capability
CAPABILITY_IMAGE: Capability
CAPABILITY_EMBED: Capability
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_END_OF_TURN: FinishReason
FINISH_REASON_STOP_SEQUENCE: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_TIME_LIMIT: FinishReason
FINISH_REASON_TOOL_CALL: FinishReason
QUANTIZATION_SCHEME_UNSPECIFIED: QuantizationScheme
QUANTIZATION_SCHEME_UNQUANTIZED: QuantizationScheme
QUANTIZATION_SCHEME_AFFINE_GROUP_INT: QuantizationScheme
QUANTIZATION_SCHEME_BLOCK_SCALED_FLOAT: QuantizationScheme
QUANTIZATION_SCHEME_GGUF_K_QUANT: QuantizationScheme
QUANTIZATION_SCHEME_GGUF_BLOCK: QuantizationScheme
QUANTIZATION_SCHEME_UNKNOWN_METHOD: QuantizationScheme

class ChatMessage(_message.Message):
    __slots__ = ("role", "content", "tool_calls", "tool_call_id", "name")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    tool_call_id: str
    name: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ..., tool_call_id: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class Tool(_message.Message):
    __slots__ = ("name", "description", "parameters_json")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_JSON_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    parameters_json: str
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., parameters_json: _Optional[str] = ...) -> None: ...

class ToolCall(_message.Message):
    __slots__ = ("id", "name", "arguments_json")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    arguments_json: str
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., arguments_json: _Optional[str] = ...) -> None: ...

class ResponseFormat(_message.Message):
    __slots__ = ("json_schema",)
    JSON_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    json_schema: str
    def __init__(self, json_schema: _Optional[str] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("model", "prompt", "messages", "max_tokens", "stop", "temperature", "top_p", "top_k", "min_p", "repeat_penalty", "seed", "tools", "response_format", "grammar", "logprobs", "top_logprobs", "presence_penalty", "frequency_penalty", "tool_choice", "logit_bias", "prompt_token_ids")
    class LogitBiasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    REPEAT_PENALTY_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FORMAT_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    TOOL_CHOICE_FIELD_NUMBER: _ClassVar[int]
    LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    model: str
    prompt: str
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    max_tokens: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    repeat_penalty: float
    seed: int
    tools: _containers.RepeatedCompositeFieldContainer[Tool]
    response_format: ResponseFormat
    grammar: str
    logprobs: bool
    top_logprobs: int
    presence_penalty: float
    frequency_penalty: float
    tool_choice: ToolChoice
    logit_bias: _containers.ScalarMap[int, float]
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, model: _Optional[str] = ..., prompt: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., max_tokens: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., min_p: _Optional[float] = ..., repeat_penalty: _Optional[float] = ..., seed: _Optional[int] = ..., tools: _Optional[_Iterable[_Union[Tool, _Mapping]]] = ..., response_format: _Optional[_Union[ResponseFormat, _Mapping]] = ..., grammar: _Optional[str] = ..., logprobs: _Optional[bool] = ..., top_logprobs: _Optional[int] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., tool_choice: _Optional[_Union[ToolChoice, _Mapping]] = ..., logit_bias: _Optional[_Mapping[int, float]] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class ToolChoice(_message.Message):
    __slots__ = ("name", "parallel_calls")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARALLEL_CALLS_FIELD_NUMBER: _ClassVar[int]
    name: str
    parallel_calls: bool
    def __init__(self, name: _Optional[str] = ..., parallel_calls: _Optional[bool] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("started", "delta", "finished", "pull_progress")
    STARTED_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    PULL_PROGRESS_FIELD_NUMBER: _ClassVar[int]
    started: GenerationStarted
    delta: TextDelta
    finished: GenerationFinished
    pull_progress: PullProgress
    def __init__(self, started: _Optional[_Union[GenerationStarted, _Mapping]] = ..., delta: _Optional[_Union[TextDelta, _Mapping]] = ..., finished: _Optional[_Union[GenerationFinished, _Mapping]] = ..., pull_progress: _Optional[_Union[PullProgress, _Mapping]] = ...) -> None: ...

class GenerationStarted(_message.Message):
    __slots__ = ("model", "backend", "prompt_tokens", "context_length", "pull_ms", "pulled_bytes")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    PULL_MS_FIELD_NUMBER: _ClassVar[int]
    PULLED_BYTES_FIELD_NUMBER: _ClassVar[int]
    model: str
    backend: str
    prompt_tokens: int
    context_length: int
    pull_ms: int
    pulled_bytes: int
    def __init__(self, model: _Optional[str] = ..., backend: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., context_length: _Optional[int] = ..., pull_ms: _Optional[int] = ..., pulled_bytes: _Optional[int] = ...) -> None: ...

class TextDelta(_message.Message):
    __slots__ = ("text", "token_ids", "logprobs")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ...) -> None: ...

class TokenLogprob(_message.Message):
    __slots__ = ("token_id", "token", "logprob", "top_logprobs")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    token: bytes
    logprob: float
    top_logprobs: _containers.RepeatedCompositeFieldContainer[TopLogprob]
    def __init__(self, token_id: _Optional[int] = ..., token: _Optional[bytes] = ..., logprob: _Optional[float] = ..., top_logprobs: _Optional[_Iterable[_Union[TopLogprob, _Mapping]]] = ...) -> None: ...

class TopLogprob(_message.Message):
    __slots__ = ("token_id", "token", "logprob")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    token: bytes
    logprob: float
    def __init__(self, token_id: _Optional[int] = ..., token: _Optional[bytes] = ..., logprob: _Optional[float] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens", "cached_prompt_tokens", "sampled_in_graph_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SAMPLED_IN_GRAPH_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int
    sampled_in_graph_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., cached_prompt_tokens: _Optional[int] = ..., sampled_in_graph_tokens: _Optional[int] = ...) -> None: ...

class Timing(_message.Message):
    __slots__ = ("ttft_ms", "decode_tokens_per_second", "total_ms", "queue_ms")
    TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    DECODE_TOKENS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_MS_FIELD_NUMBER: _ClassVar[int]
    ttft_ms: float
    decode_tokens_per_second: float
    total_ms: float
    queue_ms: float
    def __init__(self, ttft_ms: _Optional[float] = ..., decode_tokens_per_second: _Optional[float] = ..., total_ms: _Optional[float] = ..., queue_ms: _Optional[float] = ...) -> None: ...

class GenerationFinished(_message.Message):
    __slots__ = ("finish_reason", "stop_sequence", "usage", "timing", "seed", "tool_calls", "content", "tool_call_errors")
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    STOP_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_ERRORS_FIELD_NUMBER: _ClassVar[int]
    finish_reason: FinishReason
    stop_sequence: str
    usage: Usage
    timing: Timing
    seed: int
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    content: str
    tool_call_errors: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, finish_reason: _Optional[_Union[FinishReason, str]] = ..., stop_sequence: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., timing: _Optional[_Union[Timing, _Mapping]] = ..., seed: _Optional[int] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ..., content: _Optional[str] = ..., tool_call_errors: _Optional[_Iterable[str]] = ...) -> None: ...

class TokenizeRequest(_message.Message):
    __slots__ = ("model", "prompt", "messages", "tools")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    model: str
    prompt: str
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    tools: _containers.RepeatedCompositeFieldContainer[Tool]
    def __init__(self, model: _Optional[str] = ..., prompt: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., tools: _Optional[_Iterable[_Union[Tool, _Mapping]]] = ...) -> None: ...

class TokenizeResponse(_message.Message):
    __slots__ = ("token_ids", "model", "context_length")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    model: str
    context_length: int
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., model: _Optional[str] = ..., context_length: _Optional[int] = ...) -> None: ...

class DetokenizeRequest(_message.Message):
    __slots__ = ("model", "token_ids")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    model: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, model: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class DetokenizeResponse(_message.Message):
    __slots__ = ("text", "model")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    text: str
    model: str
    def __init__(self, text: _Optional[str] = ..., model: _Optional[str] = ...) -> None: ...

class AdmitRequest(_message.Message):
    __slots__ = ("model", "capability")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    model: str
    capability: Capability
    def __init__(self, model: _Optional[str] = ..., capability: _Optional[_Union[Capability, str]] = ...) -> None: ...

class Quantization(_message.Message):
    __slots__ = ("scheme", "method", "bits", "group_size")
    SCHEME_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    BITS_FIELD_NUMBER: _ClassVar[int]
    GROUP_SIZE_FIELD_NUMBER: _ClassVar[int]
    scheme: QuantizationScheme
    method: str
    bits: int
    group_size: int
    def __init__(self, scheme: _Optional[_Union[QuantizationScheme, str]] = ..., method: _Optional[str] = ..., bits: _Optional[int] = ..., group_size: _Optional[int] = ...) -> None: ...

class MemoryEstimate(_message.Message):
    __slots__ = ("weights_bytes", "kv_cache_bytes", "total_bytes", "budget_bytes", "free_bytes", "fits", "would_evict", "host_bytes", "device_bytes", "device_budget_bytes", "device_free_bytes", "parked_bytes", "measured_rss_bytes", "measured_gpu_bytes", "compute_bytes")
    WEIGHTS_BYTES_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_BYTES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    FITS_FIELD_NUMBER: _ClassVar[int]
    WOULD_EVICT_FIELD_NUMBER: _ClassVar[int]
    HOST_BYTES_FIELD_NUMBER: _ClassVar[int]
    DEVICE_BYTES_FIELD_NUMBER: _ClassVar[int]
    DEVICE_BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    PARKED_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEASURED_RSS_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEASURED_GPU_BYTES_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_BYTES_FIELD_NUMBER: _ClassVar[int]
    weights_bytes: int
    kv_cache_bytes: int
    total_bytes: int
    budget_bytes: int
    free_bytes: int
    fits: bool
    would_evict: _containers.RepeatedScalarFieldContainer[str]
    host_bytes: int
    device_bytes: int
    device_budget_bytes: int
    device_free_bytes: int
    parked_bytes: int
    measured_rss_bytes: int
    measured_gpu_bytes: int
    compute_bytes: int
    def __init__(self, weights_bytes: _Optional[int] = ..., kv_cache_bytes: _Optional[int] = ..., total_bytes: _Optional[int] = ..., budget_bytes: _Optional[int] = ..., free_bytes: _Optional[int] = ..., fits: _Optional[bool] = ..., would_evict: _Optional[_Iterable[str]] = ..., host_bytes: _Optional[int] = ..., device_bytes: _Optional[int] = ..., device_budget_bytes: _Optional[int] = ..., device_free_bytes: _Optional[int] = ..., parked_bytes: _Optional[int] = ..., measured_rss_bytes: _Optional[int] = ..., measured_gpu_bytes: _Optional[int] = ..., compute_bytes: _Optional[int] = ...) -> None: ...

class AdmitResponse(_message.Message):
    __slots__ = ("admitted", "reason", "backend", "architecture", "quantization", "memory", "loaded", "available_locally", "download")
    ADMITTED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    QUANTIZATION_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    LOADED_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_LOCALLY_FIELD_NUMBER: _ClassVar[int]
    DOWNLOAD_FIELD_NUMBER: _ClassVar[int]
    admitted: bool
    reason: str
    backend: str
    architecture: str
    quantization: Quantization
    memory: MemoryEstimate
    loaded: bool
    available_locally: bool
    download: HubDownload
    def __init__(self, admitted: _Optional[bool] = ..., reason: _Optional[str] = ..., backend: _Optional[str] = ..., architecture: _Optional[str] = ..., quantization: _Optional[_Union[Quantization, _Mapping]] = ..., memory: _Optional[_Union[MemoryEstimate, _Mapping]] = ..., loaded: _Optional[bool] = ..., available_locally: _Optional[bool] = ..., download: _Optional[_Union[HubDownload, _Mapping]] = ...) -> None: ...

class HubDownload(_message.Message):
    __slots__ = ("repo", "commit", "files", "total_bytes", "disk_free_bytes", "fits_on_disk", "choices")
    REPO_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISK_FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    FITS_ON_DISK_FIELD_NUMBER: _ClassVar[int]
    CHOICES_FIELD_NUMBER: _ClassVar[int]
    repo: str
    commit: str
    files: _containers.RepeatedCompositeFieldContainer[HubFile]
    total_bytes: int
    disk_free_bytes: int
    fits_on_disk: bool
    choices: _containers.RepeatedCompositeFieldContainer[HubFile]
    def __init__(self, repo: _Optional[str] = ..., commit: _Optional[str] = ..., files: _Optional[_Iterable[_Union[HubFile, _Mapping]]] = ..., total_bytes: _Optional[int] = ..., disk_free_bytes: _Optional[int] = ..., fits_on_disk: _Optional[bool] = ..., choices: _Optional[_Iterable[_Union[HubFile, _Mapping]]] = ...) -> None: ...

class HubFile(_message.Message):
    __slots__ = ("path", "size_bytes")
    PATH_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    path: str
    size_bytes: int
    def __init__(self, path: _Optional[str] = ..., size_bytes: _Optional[int] = ...) -> None: ...

class PullRequest(_message.Message):
    __slots__ = ("model", "capability")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    model: str
    capability: Capability
    def __init__(self, model: _Optional[str] = ..., capability: _Optional[_Union[Capability, str]] = ...) -> None: ...

class PullResponse(_message.Message):
    __slots__ = ("started", "progress", "finished")
    STARTED_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    started: PullStarted
    progress: PullProgress
    finished: PullFinished
    def __init__(self, started: _Optional[_Union[PullStarted, _Mapping]] = ..., progress: _Optional[_Union[PullProgress, _Mapping]] = ..., finished: _Optional[_Union[PullFinished, _Mapping]] = ...) -> None: ...

class PullStarted(_message.Message):
    __slots__ = ("download", "cached_bytes")
    DOWNLOAD_FIELD_NUMBER: _ClassVar[int]
    CACHED_BYTES_FIELD_NUMBER: _ClassVar[int]
    download: HubDownload
    cached_bytes: int
    def __init__(self, download: _Optional[_Union[HubDownload, _Mapping]] = ..., cached_bytes: _Optional[int] = ...) -> None: ...

class PullProgress(_message.Message):
    __slots__ = ("file", "file_bytes_done", "file_bytes_total", "bytes_done", "bytes_total", "bytes_per_second")
    FILE_FIELD_NUMBER: _ClassVar[int]
    FILE_BYTES_DONE_FIELD_NUMBER: _ClassVar[int]
    FILE_BYTES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    BYTES_DONE_FIELD_NUMBER: _ClassVar[int]
    BYTES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    BYTES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    file: str
    file_bytes_done: int
    file_bytes_total: int
    bytes_done: int
    bytes_total: int
    bytes_per_second: float
    def __init__(self, file: _Optional[str] = ..., file_bytes_done: _Optional[int] = ..., file_bytes_total: _Optional[int] = ..., bytes_done: _Optional[int] = ..., bytes_total: _Optional[int] = ..., bytes_per_second: _Optional[float] = ...) -> None: ...

class PullFinished(_message.Message):
    __slots__ = ("model", "bytes_transferred", "admit")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    BYTES_TRANSFERRED_FIELD_NUMBER: _ClassVar[int]
    ADMIT_FIELD_NUMBER: _ClassVar[int]
    model: str
    bytes_transferred: int
    admit: AdmitResponse
    def __init__(self, model: _Optional[str] = ..., bytes_transferred: _Optional[int] = ..., admit: _Optional[_Union[AdmitResponse, _Mapping]] = ...) -> None: ...

class ListCachedRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListCachedResponse(_message.Message):
    __slots__ = ("repos", "cache_dir", "disk_free_bytes")
    REPOS_FIELD_NUMBER: _ClassVar[int]
    CACHE_DIR_FIELD_NUMBER: _ClassVar[int]
    DISK_FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    repos: _containers.RepeatedCompositeFieldContainer[CachedRepo]
    cache_dir: str
    disk_free_bytes: int
    def __init__(self, repos: _Optional[_Iterable[_Union[CachedRepo, _Mapping]]] = ..., cache_dir: _Optional[str] = ..., disk_free_bytes: _Optional[int] = ...) -> None: ...

class CachedRepo(_message.Message):
    __slots__ = ("repo", "revisions", "size_bytes", "incomplete_bytes", "last_used_unix_ms")
    REPO_FIELD_NUMBER: _ClassVar[int]
    REVISIONS_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    INCOMPLETE_BYTES_FIELD_NUMBER: _ClassVar[int]
    LAST_USED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    repo: str
    revisions: _containers.RepeatedCompositeFieldContainer[CachedRevision]
    size_bytes: int
    incomplete_bytes: int
    last_used_unix_ms: int
    def __init__(self, repo: _Optional[str] = ..., revisions: _Optional[_Iterable[_Union[CachedRevision, _Mapping]]] = ..., size_bytes: _Optional[int] = ..., incomplete_bytes: _Optional[int] = ..., last_used_unix_ms: _Optional[int] = ...) -> None: ...

class CachedRevision(_message.Message):
    __slots__ = ("commit", "refs", "files", "size_bytes", "last_modified_unix_ms")
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    REFS_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    LAST_MODIFIED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    commit: str
    refs: _containers.RepeatedScalarFieldContainer[str]
    files: _containers.RepeatedCompositeFieldContainer[HubFile]
    size_bytes: int
    last_modified_unix_ms: int
    def __init__(self, commit: _Optional[str] = ..., refs: _Optional[_Iterable[str]] = ..., files: _Optional[_Iterable[_Union[HubFile, _Mapping]]] = ..., size_bytes: _Optional[int] = ..., last_modified_unix_ms: _Optional[int] = ...) -> None: ...

class DeleteCachedRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class DeleteCachedResponse(_message.Message):
    __slots__ = ("commits", "freed_bytes")
    COMMITS_FIELD_NUMBER: _ClassVar[int]
    FREED_BYTES_FIELD_NUMBER: _ClassVar[int]
    commits: _containers.RepeatedScalarFieldContainer[str]
    freed_bytes: int
    def __init__(self, commits: _Optional[_Iterable[str]] = ..., freed_bytes: _Optional[int] = ...) -> None: ...

class GenerateImageRequest(_message.Message):
    __slots__ = ("model", "prompt", "negative_prompt", "width", "height", "steps", "guidance", "seed")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    NEGATIVE_PROMPT_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    GUIDANCE_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    model: str
    prompt: str
    negative_prompt: str
    width: int
    height: int
    steps: int
    guidance: float
    seed: int
    def __init__(self, model: _Optional[str] = ..., prompt: _Optional[str] = ..., negative_prompt: _Optional[str] = ..., width: _Optional[int] = ..., height: _Optional[int] = ..., steps: _Optional[int] = ..., guidance: _Optional[float] = ..., seed: _Optional[int] = ...) -> None: ...

class GenerateImageResponse(_message.Message):
    __slots__ = ("progress", "image")
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    progress: ImageProgress
    image: GeneratedImage
    def __init__(self, progress: _Optional[_Union[ImageProgress, _Mapping]] = ..., image: _Optional[_Union[GeneratedImage, _Mapping]] = ...) -> None: ...

class ImageProgress(_message.Message):
    __slots__ = ("step", "total_steps", "elapsed_ms")
    STEP_FIELD_NUMBER: _ClassVar[int]
    TOTAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_MS_FIELD_NUMBER: _ClassVar[int]
    step: int
    total_steps: int
    elapsed_ms: float
    def __init__(self, step: _Optional[int] = ..., total_steps: _Optional[int] = ..., elapsed_ms: _Optional[float] = ...) -> None: ...

class GeneratedImage(_message.Message):
    __slots__ = ("data", "media_type", "width", "height", "seed", "model", "backend", "total_ms")
    DATA_FIELD_NUMBER: _ClassVar[int]
    MEDIA_TYPE_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MS_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    media_type: str
    width: int
    height: int
    seed: int
    model: str
    backend: str
    total_ms: float
    def __init__(self, data: _Optional[bytes] = ..., media_type: _Optional[str] = ..., width: _Optional[int] = ..., height: _Optional[int] = ..., seed: _Optional[int] = ..., model: _Optional[str] = ..., backend: _Optional[str] = ..., total_ms: _Optional[float] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("name", "source", "backend", "capabilities", "is_default", "loaded", "memory_bytes", "last_used_unix_ms", "context_length", "engine_pid", "rss_bytes", "gpu_memory_bytes", "unloadable_reason")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    IS_DEFAULT_FIELD_NUMBER: _ClassVar[int]
    LOADED_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    LAST_USED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    ENGINE_PID_FIELD_NUMBER: _ClassVar[int]
    RSS_BYTES_FIELD_NUMBER: _ClassVar[int]
    GPU_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    UNLOADABLE_REASON_FIELD_NUMBER: _ClassVar[int]
    name: str
    source: str
    backend: str
    capabilities: _containers.RepeatedScalarFieldContainer[Capability]
    is_default: bool
    loaded: bool
    memory_bytes: int
    last_used_unix_ms: int
    context_length: int
    engine_pid: int
    rss_bytes: int
    gpu_memory_bytes: int
    unloadable_reason: str
    def __init__(self, name: _Optional[str] = ..., source: _Optional[str] = ..., backend: _Optional[str] = ..., capabilities: _Optional[_Iterable[_Union[Capability, str]]] = ..., is_default: _Optional[bool] = ..., loaded: _Optional[bool] = ..., memory_bytes: _Optional[int] = ..., last_used_unix_ms: _Optional[int] = ..., context_length: _Optional[int] = ..., engine_pid: _Optional[int] = ..., rss_bytes: _Optional[int] = ..., gpu_memory_bytes: _Optional[int] = ..., unloadable_reason: _Optional[str] = ...) -> None: ...

class ServerLoad(_message.Message):
    __slots__ = ("running", "waiting", "max_running", "max_waiting")
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    MAX_RUNNING_FIELD_NUMBER: _ClassVar[int]
    MAX_WAITING_FIELD_NUMBER: _ClassVar[int]
    running: int
    waiting: int
    max_running: int
    max_waiting: int
    def __init__(self, running: _Optional[int] = ..., waiting: _Optional[int] = ..., max_running: _Optional[int] = ..., max_waiting: _Optional[int] = ...) -> None: ...

class ListModelsResponse(_message.Message):
    __slots__ = ("models", "default_model", "load")
    MODELS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_MODEL_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ModelInfo]
    default_model: str
    load: ServerLoad
    def __init__(self, models: _Optional[_Iterable[_Union[ModelInfo, _Mapping]]] = ..., default_model: _Optional[str] = ..., load: _Optional[_Union[ServerLoad, _Mapping]] = ...) -> None: ...

class EmbedRequest(_message.Message):
    __slots__ = ("model", "inputs", "normalize", "truncate")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    NORMALIZE_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_FIELD_NUMBER: _ClassVar[int]
    model: str
    inputs: _containers.RepeatedCompositeFieldContainer[EmbedInput]
    normalize: bool
    truncate: bool
    def __init__(self, model: _Optional[str] = ..., inputs: _Optional[_Iterable[_Union[EmbedInput, _Mapping]]] = ..., normalize: _Optional[bool] = ..., truncate: _Optional[bool] = ...) -> None: ...

class EmbedInput(_message.Message):
    __slots__ = ("text", "tokens")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    text: str
    tokens: EmbedTokens
    def __init__(self, text: _Optional[str] = ..., tokens: _Optional[_Union[EmbedTokens, _Mapping]] = ...) -> None: ...

class EmbedTokens(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class EmbedResponse(_message.Message):
    __slots__ = ("embeddings", "model", "dimensions", "pooling", "normalized", "prompt_tokens", "total_ms")
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DIMENSIONS_FIELD_NUMBER: _ClassVar[int]
    POOLING_FIELD_NUMBER: _ClassVar[int]
    NORMALIZED_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MS_FIELD_NUMBER: _ClassVar[int]
    embeddings: _containers.RepeatedCompositeFieldContainer[Embedding]
    model: str
    dimensions: int
    pooling: str
    normalized: bool
    prompt_tokens: int
    total_ms: float
    def __init__(self, embeddings: _Optional[_Iterable[_Union[Embedding, _Mapping]]] = ..., model: _Optional[str] = ..., dimensions: _Optional[int] = ..., pooling: _Optional[str] = ..., normalized: _Optional[bool] = ..., prompt_tokens: _Optional[int] = ..., total_ms: _Optional[float] = ...) -> None: ...

class Embedding(_message.Message):
    __slots__ = ("values", "tokens", "truncated")
    VALUES_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    tokens: int
    truncated: bool
    def __init__(self, values: _Optional[_Iterable[float]] = ..., tokens: _Optional[int] = ..., truncated: _Optional[bool] = ...) -> None: ...
