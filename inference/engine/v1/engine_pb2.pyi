from inference.v1 import inference_pb2 as _inference_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ToEngine(_message.Message):
    __slots__ = ("load", "generate", "generate_image", "cancel", "shutdown", "tokenize", "detokenize", "embed")
    LOAD_FIELD_NUMBER: _ClassVar[int]
    GENERATE_FIELD_NUMBER: _ClassVar[int]
    GENERATE_IMAGE_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    SHUTDOWN_FIELD_NUMBER: _ClassVar[int]
    TOKENIZE_FIELD_NUMBER: _ClassVar[int]
    DETOKENIZE_FIELD_NUMBER: _ClassVar[int]
    EMBED_FIELD_NUMBER: _ClassVar[int]
    load: Load
    generate: Generate
    generate_image: GenerateImage
    cancel: Cancel
    shutdown: Shutdown
    tokenize: Tokenize
    detokenize: Detokenize
    embed: Embed
    def __init__(self, load: _Optional[_Union[Load, _Mapping]] = ..., generate: _Optional[_Union[Generate, _Mapping]] = ..., generate_image: _Optional[_Union[GenerateImage, _Mapping]] = ..., cancel: _Optional[_Union[Cancel, _Mapping]] = ..., shutdown: _Optional[_Union[Shutdown, _Mapping]] = ..., tokenize: _Optional[_Union[Tokenize, _Mapping]] = ..., detokenize: _Optional[_Union[Detokenize, _Mapping]] = ..., embed: _Optional[_Union[Embed, _Mapping]] = ...) -> None: ...

class FromEngine(_message.Message):
    __slots__ = ("loaded", "load_failed", "events", "model_failed", "heartbeat")
    LOADED_FIELD_NUMBER: _ClassVar[int]
    LOAD_FAILED_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FAILED_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    loaded: Loaded
    load_failed: Status
    events: EventBatch
    model_failed: str
    heartbeat: Heartbeat
    def __init__(self, loaded: _Optional[_Union[Loaded, _Mapping]] = ..., load_failed: _Optional[_Union[Status, _Mapping]] = ..., events: _Optional[_Union[EventBatch, _Mapping]] = ..., model_failed: _Optional[str] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("progress",)
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    progress: int
    def __init__(self, progress: _Optional[int] = ...) -> None: ...

class Load(_message.Message):
    __slots__ = ("name", "backend", "path", "context_size", "threads", "gpu_layers", "main_gpu", "flash_attention", "parallel_sequences", "cached_sequences", "kv_layout", "stream_interval", "max_waiting_sequences", "chat_template", "default_max_tokens", "max_decode_seconds", "log_level", "batch_size", "sample_in_graph", "request_token_budget", "embed_batch_tokens", "draft_tokens")
    NAME_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_SIZE_FIELD_NUMBER: _ClassVar[int]
    THREADS_FIELD_NUMBER: _ClassVar[int]
    GPU_LAYERS_FIELD_NUMBER: _ClassVar[int]
    MAIN_GPU_FIELD_NUMBER: _ClassVar[int]
    FLASH_ATTENTION_FIELD_NUMBER: _ClassVar[int]
    PARALLEL_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    CACHED_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    KV_LAYOUT_FIELD_NUMBER: _ClassVar[int]
    STREAM_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    MAX_WAITING_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    CHAT_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_DECODE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LOG_LEVEL_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_IN_GRAPH_FIELD_NUMBER: _ClassVar[int]
    REQUEST_TOKEN_BUDGET_FIELD_NUMBER: _ClassVar[int]
    EMBED_BATCH_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    name: str
    backend: str
    path: str
    context_size: int
    threads: int
    gpu_layers: int
    main_gpu: int
    flash_attention: str
    parallel_sequences: int
    cached_sequences: int
    kv_layout: str
    stream_interval: int
    max_waiting_sequences: int
    chat_template: str
    default_max_tokens: int
    max_decode_seconds: float
    log_level: str
    batch_size: int
    sample_in_graph: str
    request_token_budget: int
    embed_batch_tokens: int
    draft_tokens: int
    def __init__(self, name: _Optional[str] = ..., backend: _Optional[str] = ..., path: _Optional[str] = ..., context_size: _Optional[int] = ..., threads: _Optional[int] = ..., gpu_layers: _Optional[int] = ..., main_gpu: _Optional[int] = ..., flash_attention: _Optional[str] = ..., parallel_sequences: _Optional[int] = ..., cached_sequences: _Optional[int] = ..., kv_layout: _Optional[str] = ..., stream_interval: _Optional[int] = ..., max_waiting_sequences: _Optional[int] = ..., chat_template: _Optional[str] = ..., default_max_tokens: _Optional[int] = ..., max_decode_seconds: _Optional[float] = ..., log_level: _Optional[str] = ..., batch_size: _Optional[int] = ..., sample_in_graph: _Optional[str] = ..., request_token_budget: _Optional[int] = ..., embed_batch_tokens: _Optional[int] = ..., draft_tokens: _Optional[int] = ...) -> None: ...

class Loaded(_message.Message):
    __slots__ = ("backend", "context_length", "computes_off_cpu")
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    COMPUTES_OFF_CPU_FIELD_NUMBER: _ClassVar[int]
    backend: str
    context_length: int
    computes_off_cpu: bool
    def __init__(self, backend: _Optional[str] = ..., context_length: _Optional[int] = ..., computes_off_cpu: _Optional[bool] = ...) -> None: ...

class Status(_message.Message):
    __slots__ = ("code", "message", "param", "error")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PARAM_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    param: str
    error: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., param: _Optional[str] = ..., error: _Optional[str] = ...) -> None: ...

class Generate(_message.Message):
    __slots__ = ("id", "received_at", "request_id", "text")
    ID_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_AT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    id: int
    received_at: float
    request_id: str
    text: TextRequest
    def __init__(self, id: _Optional[int] = ..., received_at: _Optional[float] = ..., request_id: _Optional[str] = ..., text: _Optional[_Union[TextRequest, _Mapping]] = ...) -> None: ...

class TextRequest(_message.Message):
    __slots__ = ("model", "prompt", "messages", "max_tokens", "stop", "sampling", "tools", "grammar", "grammar_branches", "logprobs", "top_logprobs", "tool_choice", "prompt_token_ids")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_BRANCHES_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CHOICE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    model: str
    prompt: str
    messages: _containers.RepeatedCompositeFieldContainer[_inference_pb2.ChatMessage]
    max_tokens: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    sampling: Sampling
    tools: _containers.RepeatedCompositeFieldContainer[_inference_pb2.Tool]
    grammar: str
    grammar_branches: int
    logprobs: bool
    top_logprobs: int
    tool_choice: _inference_pb2.ToolChoice
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, model: _Optional[str] = ..., prompt: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[_inference_pb2.ChatMessage, _Mapping]]] = ..., max_tokens: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., sampling: _Optional[_Union[Sampling, _Mapping]] = ..., tools: _Optional[_Iterable[_Union[_inference_pb2.Tool, _Mapping]]] = ..., grammar: _Optional[str] = ..., grammar_branches: _Optional[int] = ..., logprobs: _Optional[bool] = ..., top_logprobs: _Optional[int] = ..., tool_choice: _Optional[_Union[_inference_pb2.ToolChoice, _Mapping]] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class Sampling(_message.Message):
    __slots__ = ("temperature", "top_p", "top_k", "min_p", "repeat_penalty", "seed", "presence_penalty", "frequency_penalty", "logit_bias")
    class LogitBiasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    REPEAT_PENALTY_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    repeat_penalty: float
    seed: int
    presence_penalty: float
    frequency_penalty: float
    logit_bias: _containers.ScalarMap[int, float]
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., min_p: _Optional[float] = ..., repeat_penalty: _Optional[float] = ..., seed: _Optional[int] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., logit_bias: _Optional[_Mapping[int, float]] = ...) -> None: ...

class Tokenize(_message.Message):
    __slots__ = ("id", "request_id", "prompt", "messages", "tools")
    ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    id: int
    request_id: str
    prompt: str
    messages: _containers.RepeatedCompositeFieldContainer[_inference_pb2.ChatMessage]
    tools: _containers.RepeatedCompositeFieldContainer[_inference_pb2.Tool]
    def __init__(self, id: _Optional[int] = ..., request_id: _Optional[str] = ..., prompt: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[_inference_pb2.ChatMessage, _Mapping]]] = ..., tools: _Optional[_Iterable[_Union[_inference_pb2.Tool, _Mapping]]] = ...) -> None: ...

class Detokenize(_message.Message):
    __slots__ = ("id", "request_id", "token_ids")
    ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    id: int
    request_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, id: _Optional[int] = ..., request_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class Embed(_message.Message):
    __slots__ = ("id", "received_at", "request_id", "inputs", "normalize", "truncate")
    ID_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_AT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    NORMALIZE_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_FIELD_NUMBER: _ClassVar[int]
    id: int
    received_at: float
    request_id: str
    inputs: _containers.RepeatedCompositeFieldContainer[_inference_pb2.EmbedInput]
    normalize: bool
    truncate: bool
    def __init__(self, id: _Optional[int] = ..., received_at: _Optional[float] = ..., request_id: _Optional[str] = ..., inputs: _Optional[_Iterable[_Union[_inference_pb2.EmbedInput, _Mapping]]] = ..., normalize: _Optional[bool] = ..., truncate: _Optional[bool] = ...) -> None: ...

class GenerateImage(_message.Message):
    __slots__ = ("id", "received_at", "request", "request_id")
    ID_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_AT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    id: int
    received_at: float
    request: _inference_pb2.GenerateImageRequest
    request_id: str
    def __init__(self, id: _Optional[int] = ..., received_at: _Optional[float] = ..., request: _Optional[_Union[_inference_pb2.GenerateImageRequest, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class Cancel(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: int
    def __init__(self, id: _Optional[int] = ...) -> None: ...

class Shutdown(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("id", "text", "image_progress", "image", "end", "tokenized", "detokenized", "embedded")
    ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    IMAGE_PROGRESS_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    TOKENIZED_FIELD_NUMBER: _ClassVar[int]
    DETOKENIZED_FIELD_NUMBER: _ClassVar[int]
    EMBEDDED_FIELD_NUMBER: _ClassVar[int]
    id: int
    text: _inference_pb2.GenerateResponse
    image_progress: _inference_pb2.ImageProgress
    image: RenderedImage
    end: Status
    tokenized: _inference_pb2.TokenizeResponse
    detokenized: _inference_pb2.DetokenizeResponse
    embedded: _inference_pb2.EmbedResponse
    def __init__(self, id: _Optional[int] = ..., text: _Optional[_Union[_inference_pb2.GenerateResponse, _Mapping]] = ..., image_progress: _Optional[_Union[_inference_pb2.ImageProgress, _Mapping]] = ..., image: _Optional[_Union[RenderedImage, _Mapping]] = ..., end: _Optional[_Union[Status, _Mapping]] = ..., tokenized: _Optional[_Union[_inference_pb2.TokenizeResponse, _Mapping]] = ..., detokenized: _Optional[_Union[_inference_pb2.DetokenizeResponse, _Mapping]] = ..., embedded: _Optional[_Union[_inference_pb2.EmbedResponse, _Mapping]] = ...) -> None: ...

class RenderedImage(_message.Message):
    __slots__ = ("png", "width", "height")
    PNG_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    png: bytes
    width: int
    height: int
    def __init__(self, png: _Optional[bytes] = ..., width: _Optional[int] = ..., height: _Optional[int] = ...) -> None: ...

class EventBatch(_message.Message):
    __slots__ = ("events", "running", "waiting")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[Event]
    running: int
    waiting: int
    def __init__(self, events: _Optional[_Iterable[_Union[Event, _Mapping]]] = ..., running: _Optional[int] = ..., waiting: _Optional[int] = ...) -> None: ...
