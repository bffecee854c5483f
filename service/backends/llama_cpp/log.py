"""llama.cpp's log, routed into ours.

llama.cpp reports through one process-wide callback. Its warnings and errors
go to our structured log, or to a capture for a check that reports them
itself; its debug and info lines are dropped. llama-cpp-python's own callback
predates ggml's current level numbering and prints warnings even with
verbose=False, which breaks JSON logs, so we replace it at import.

Dropping a line in Python still costs the GIL, and the CUDA backend logs a
DEBUG line on every decode step. Where setuptools built
service/backends/native/log_filter.c, that filter sits in front of ours and
drops those lines in C.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TypeVar

import llama_cpp
import structlog

from service.scratch import memory_file

# ggml_log_level in ggml.h.
GGML_LOG_DEBUG, GGML_LOG_WARN, GGML_LOG_ERROR = 1, 3, 4

T = TypeVar("T")

_log = structlog.get_logger("llama.cpp")
_captured = threading.local()

# llama.cpp's grammar parser prints its complaint, then the whole grammar, to the
# process's stderr (not its log), starting with this.
PARSER_MARKER = "error parsing grammar: "
_stderr_lock = threading.Lock()


@llama_cpp.llama_log_callback  # type: ignore[untyped-decorator]
def forward_native_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    """Send llama.cpp's warnings and errors to our log; drop its chatter."""
    if level not in (GGML_LOG_WARN, GGML_LOG_ERROR):
        return
    message = text.decode("utf-8", errors="replace").strip()
    if any(known in message for known in getattr(_captured, "expected", ())):
        return
    errors: list[str] | None = getattr(_captured, "errors", None)
    if errors is not None and level == GGML_LOG_ERROR:
        errors.append(message)
    capture: list[str] | None = getattr(_captured, "lines", None)
    if capture is not None:
        capture.append(message)
    elif message:
        emit = _log.error if level == GGML_LOG_ERROR else _log.warning
        emit("llama.cpp says", message=message)


@contextmanager
def _on_this_thread(setting: str, value: T, after: object) -> Iterator[T]:
    """`setting` of this thread's log routing is `value` inside the block."""
    setattr(_captured, setting, value)
    try:
        yield value
    finally:
        setattr(_captured, setting, after)


def captured_native_log() -> AbstractContextManager[list[str]]:
    """Collect what llama.cpp logs on this thread instead of logging it."""
    return _on_this_thread("lines", [], None)


@contextmanager
def captured_parser_output() -> Iterator[list[str]]:
    """What llama.cpp's grammar parser prints to file descriptor 2 inside the block.

    The grammar it repeats could be 64 KiB of a client's text in the middle of
    JSON logs, so the descriptor points at a file in memory (no temporary directory
    needed) for the few microseconds of a parse, under a lock; what other threads
    wrote meanwhile (all that precedes the parser's marker) is written back.
    """
    printed: list[str] = []
    with _stderr_lock, memory_file("parser-output") as sink:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            yield printed
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            text = sink.read().decode("utf-8", errors="replace")
            printed.append(text)
            foreign = text[: text.find(PARSER_MARKER)] if PARSER_MARKER in text else text
            foreign = foreign.removesuffix("parse: ")
            if foreign:
                os.write(2, foreign.encode("utf-8"))


def recorded_native_errors() -> AbstractContextManager[list[str]]:
    """Log llama.cpp's lines as usual, and also collect its errors on this thread,
    for a caller that must say why a call failed (llama.cpp returns only NULL)."""
    return _on_this_thread("errors", [], None)


def expected_native_warnings(*fragments: str) -> AbstractContextManager[tuple[str, ...]]:
    """Drop, on this thread, llama.cpp's lines that contain one of `fragments`:
    warnings the caller has accounted for, which would only alarm an operator."""
    return _on_this_thread("expected", fragments, ())


def load_native_filter() -> ctypes.CDLL | None:
    """The compiled filter, or None where it was not built (no C compiler)."""
    spec = importlib.util.find_spec("service.backends.native._log_filter")
    if spec is None or spec.origin is None:
        return None
    library = ctypes.CDLL(spec.origin)
    library.log_filter_set.argtypes = [llama_cpp.llama_log_callback, ctypes.c_int]
    library.log_filter_set.restype = None
    return library


def install() -> str:
    """Point llama.cpp's log at our callback, through the C filter where built.

    Returns which filter runs: "native" or "python".
    """
    global _native_filter
    _native_filter = load_native_filter()
    if _native_filter is None:
        llama_cpp.llama_log_set(forward_native_log, ctypes.c_void_p(0))
        return "python"
    _native_filter.log_filter_set(forward_native_log, GGML_LOG_WARN)
    entry = ctypes.cast(_native_filter.log_filter, llama_cpp.llama_log_callback)
    llama_cpp.llama_log_set(entry, ctypes.c_void_p(0))
    return "native"


def installed_callback_address() -> int:
    """The address llama.cpp calls for each log line now."""
    callback = llama_cpp.llama_log_callback()
    user_data = ctypes.c_void_p()
    llama_cpp.llama_log_get(ctypes.byref(callback), ctypes.byref(user_data))
    return ctypes.cast(callback, ctypes.c_void_p).value or 0


# Kept referenced for as long as llama.cpp may call it.
_native_filter: ctypes.CDLL | None = None
FILTER = install()
