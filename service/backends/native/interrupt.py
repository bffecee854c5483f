"""A flag that stops one llama.cpp context's forward pass between two graph nodes.

interrupt.c is the abort callback llama.cpp's CPU backend calls; the flag it
reads is an int owned here, set and cleared from any thread. A GPU backend does
not ask the callback (its steps are short): there the flag changes nothing.
Where interrupt.c was not built nothing is installed, and a step always runs to
its end.
"""

from __future__ import annotations

import ctypes
import importlib.util
from functools import cache
from typing import Any

import llama_cpp


@cache
def _callback() -> Any:
    """The C function, as the function pointer (a ggml_abort_callback) that
    llama_set_abort_callback takes."""
    spec = importlib.util.find_spec("service.backends.native._interrupt")
    if spec is None or spec.origin is None:
        return None
    address = ctypes.cast(ctypes.CDLL(spec.origin).step_interrupted, ctypes.c_void_p).value
    return None if address is None else llama_cpp.ggml_abort_callback(address)


class StepInterrupt:
    """One context's interrupt flag; the context must not outlive it."""

    def __init__(self) -> None:
        self._flag = ctypes.c_int(0)

    def install(self, context: llama_cpp.llama_context_p) -> None:
        """Have `context`'s forward passes read the flag (where interrupt.c was built)."""
        callback = _callback()
        if callback is not None:
            llama_cpp.llama_set_abort_callback(context, callback, ctypes.addressof(self._flag))

    def set(self, interrupted: bool) -> None:
        """Ask the forward pass in progress, and every later one, to stop (True), or
        let them run (False)."""
        self._flag.value = int(interrupted)
