"""The llama.cpp backend (llama-cpp-python) for GGUF files."""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Generator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp
import structlog

from service.backends.base import TokenStream, common_prefix_length
from service.errors import BackendFailure
from service.generation import SamplingDefaults, SamplingParams

BACKEND_NAME = "llama.cpp"

# GGUF keys where a model may state its own sampling defaults, and the
# SamplingDefaults fields they fill.
_SAMPLING_KEYS = {
    "general.sampling.temp": ("temperature", float),
    "general.sampling.top_p": ("top_p", float),
    "general.sampling.top_k": ("top_k", int),
    "general.sampling.min_p": ("min_p", float),
    "general.sampling.penalty_repeat": ("repeat_penalty", float),
}


# ggml's log levels. llama-cpp-python's own log callback predates the current
# numbering and prints warnings even when verbose=False, which breaks JSON logs.
_GGML_LOG_WARN, _GGML_LOG_ERROR = 3, 4
_native_log = structlog.get_logger("llama.cpp")


_captured = threading.local()


@llama_cpp.llama_log_callback  # type: ignore[untyped-decorator]
def _forward_native_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    """Send llama.cpp's warnings and errors to our log; drop its chatter."""
    if level not in (_GGML_LOG_WARN, _GGML_LOG_ERROR):
        return
    message = text.decode("utf-8", errors="replace").strip()
    capture: list[str] | None = getattr(_captured, "lines", None)
    if capture is not None:
        capture.append(message)
    elif message:
        emit = _native_log.error if level == _GGML_LOG_ERROR else _native_log.warning
        emit("llama.cpp says", message=message)


@contextmanager
def captured_native_log() -> Iterator[list[str]]:
    """Collect what llama.cpp logs on this thread instead of logging it."""
    lines: list[str] = []
    _captured.lines = lines
    try:
        yield lines
    finally:
        _captured.lines = None


llama_cpp.llama_log_set(_forward_native_log, ctypes.c_void_p(0))


@dataclass(frozen=True)
class LlamaCppOptions:
    context_size: int
    threads: int
    gpu_layers: int = -1
    batch_size: int = 512


def _load(path: Path, options: LlamaCppOptions, context_size: int) -> llama_cpp.Llama:
    try:
        return llama_cpp.Llama(
            model_path=str(path),
            n_ctx=context_size,
            n_batch=options.batch_size,
            n_threads=options.threads,
            n_threads_batch=options.threads,
            n_gpu_layers=options.gpu_layers,
            verbose=False,
        )
    except ValueError as exc:  # llama-cpp-python's way of saying "load failed"
        raise BackendFailure(f"llama.cpp could not load {path.name}: {exc}") from exc


class LlamaCppBackend:
    """One GGUF model loaded with llama.cpp. Not thread-safe: one worker owns it."""

    def __init__(self, path: Path, options: LlamaCppOptions) -> None:
        self._llama = _load(path, options, options.context_size)
        trained = self._llama._model.n_ctx_train()
        if 0 < trained < options.context_size:
            # A window beyond the trained one gives garbage; reload at the trained size.
            self._llama.close()
            self._llama = _load(path, options, trained)
        self._vocab = llama_cpp.llama_model_get_vocab(self._llama.model)
        self._metadata: dict[str, str] = dict(self._llama.metadata)
        self._piece_buffer = ctypes.create_string_buffer(256)
        self._closed = threading.Event()
        self._fault_after: int | None = None

    @property
    def name(self) -> str:
        return BACKEND_NAME

    @property
    def context_length(self) -> int:
        return int(self._llama.n_ctx())

    @property
    def chat_template(self) -> str | None:
        return self._metadata.get("tokenizer.chat_template")

    @property
    def template_tokens(self) -> dict[str, str]:
        return {
            "bos_token": self._token_text(self._llama.token_bos()),
            "eos_token": self._token_text(self._llama.token_eos()),
        }

    @property
    def adds_bos(self) -> bool:
        return bool(llama_cpp.llama_vocab_get_add_bos(self._vocab))

    def is_end_of_generation(self, token_id: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token_id))

    def sampling_defaults(self) -> SamplingDefaults:
        found: dict[str, Any] = {}
        for key, (field_name, convert) in _SAMPLING_KEYS.items():
            if key in self._metadata:
                found[field_name] = convert(self._metadata[key])
        return SamplingDefaults(**found)

    def tokenize(self, text: str, *, add_bos: bool) -> list[int]:
        ids = self._llama.tokenize(text.encode("utf-8"), add_bos=add_bos, special=True)
        return [int(token) for token in ids]

    def token_bytes(self, token_id: int) -> bytes:
        buffer = self._piece_buffer
        size = llama_cpp.llama_token_to_piece(self._vocab, token_id, buffer, len(buffer), 0, False)
        if size < 0:  # the buffer is too small for this piece
            buffer = ctypes.create_string_buffer(-size)
            size = llama_cpp.llama_token_to_piece(self._vocab, token_id, buffer, -size, 0, False)
        return buffer.raw[:size]

    def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> TokenStream:
        reused = self._reuse_cached_prefix(prompt_ids)
        return TokenStream(
            cached_prompt_tokens=reused,
            tokens=self._sample(list(prompt_ids[reused:]), sampling),
        )

    def close(self) -> None:
        if not self._closed.is_set():
            self._closed.set()
            self._llama.close()

    def inject_fault(self, after_tokens: int) -> None:
        """Test hook: fail the next generation after `after_tokens` tokens, as a crashed
        forward pass would. It exercises the real recovery path (the pool discards
        the model and loads it afresh) without a fake backend."""
        self._fault_after = after_tokens

    def _sample(self, new_ids: list[int], sampling: SamplingParams) -> Generator[int, None, None]:
        self._llama.set_seed(sampling.seed)
        fault_after, self._fault_after = self._fault_after, None
        tokens = self._llama.generate(
            new_ids,
            reset=False,  # _reuse_cached_prefix already positioned the cache
            temp=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            min_p=sampling.min_p,
            repeat_penalty=sampling.repeat_penalty,
        )
        for count, token in enumerate(tokens):
            if count == fault_after:
                raise RuntimeError("injected fault: llama.cpp forward pass failed")
            yield token

    def _reuse_cached_prefix(self, prompt_ids: Sequence[int]) -> int:
        """Keep the longest cached prefix of the prompt; return its length.

        At least one prompt token is always evaluated again, so that the
        logits the first sample reads belong to this prompt.
        """
        llama = self._llama
        cached = llama.input_ids[: llama.n_tokens].tolist()
        common = common_prefix_length(cached, prompt_ids[:-1])
        if common > 0 and llama._ctx.kv_cache_seq_rm(-1, common, -1):
            llama.n_tokens = common
            return common
        llama.reset()  # eval() then clears the whole cache from position 0
        return 0

    def _token_text(self, token_id: int) -> str:
        if token_id < 0:
            return ""
        return bytes(llama_cpp.llama_vocab_get_text(self._vocab, token_id)).decode(
            "utf-8", errors="replace"
        )
