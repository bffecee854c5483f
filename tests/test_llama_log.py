"""llama.cpp's log: warnings reach ours, chatter is dropped before Python sees it."""

import ctypes
from typing import Any

import llama_cpp
import structlog.testing

from service.backends.llama_cpp import log as llama_log
from service.backends.llama_cpp.log import GGML_LOG_DEBUG, GGML_LOG_ERROR, GGML_LOG_WARN

_GGML_LOG_INFO, _GGML_LOG_CONT = 2, 5


def _native_entry() -> Any:
    library = llama_log.load_native_filter()
    assert library is not None, "make install builds service/backends/native/log_filter.c"
    entry = library.log_filter
    entry.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p]
    entry.restype = None
    return entry


def test_make_install_builds_the_native_filter_and_llama_cpp_calls_it():
    assert llama_log.FILTER == "native"
    library = llama_log.load_native_filter()
    assert library is not None
    filter_address = ctypes.cast(library.log_filter, ctypes.c_void_p).value
    assert llama_log.installed_callback_address() == filter_address


def test_the_native_filter_passes_warnings_and_errors_only():
    library = llama_log.load_native_filter()
    assert library is not None
    reached: list[tuple[int, bytes]] = []

    @llama_cpp.llama_log_callback
    def record(level, text, user_data):
        reached.append((level, text))

    entry = _native_entry()
    library.log_filter_set(record, GGML_LOG_WARN)
    try:
        entry(GGML_LOG_DEBUG, b"CUDA Graph id 7 reused\n", None)
        entry(_GGML_LOG_INFO, b"loading model\n", None)
        entry(GGML_LOG_WARN, b"a warning\n", None)
        entry(_GGML_LOG_CONT, b"...continued\n", None)
        entry(GGML_LOG_ERROR, b"an error\n", None)
    finally:
        library.log_filter_set(llama_log.forward_native_log, GGML_LOG_WARN)
    assert reached == [(GGML_LOG_WARN, b"a warning\n"), (GGML_LOG_ERROR, b"an error\n")]


def test_a_real_llama_cpp_error_arrives_through_the_filter():
    with llama_log.captured_native_log() as lines:
        sampler = llama_cpp.llama_sampler_init_grammar(None, b'root ::= "open', b"root")
    if sampler:
        llama_cpp.llama_sampler_free(sampler)
    assert "failed to parse grammar" in lines


def test_warnings_outside_a_capture_go_to_the_service_log():
    entry = _native_entry()
    with structlog.testing.capture_logs() as logged:
        entry(GGML_LOG_WARN, b"model has no tokenizer.ggml.pre\n", None)
        entry(GGML_LOG_DEBUG, b"CUDA Graph id 8 reused\n", None)
    said = [(line["log_level"], line["message"]) for line in logged]
    assert said == [("warning", "model has no tokenizer.ggml.pre")]
