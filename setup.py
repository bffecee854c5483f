"""The compiled pieces; everything else about the package is in pyproject.toml.

Plain shared libraries loaded with ctypes, so they need a C compiler but no Python
headers: llama.cpp's log filter (service/backends/llama_cpp/log.py says why it is
C), the batched sampler's draw (service/backends/native/sampler.c) and the flag
that interrupts a step (service/backends/native/interrupt.c). All are optional:
where they cannot be built, Python and numpy do the same work, slower, and a step
whose every request was cancelled runs to its end.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "service.backends.native._log_filter",
            sources=["service/backends/native/log_filter.c"],
            optional=True,
        ),
        Extension(
            "service.backends.native._sampler",
            sources=["service/backends/native/sampler.c"],
            libraries=["m"],
            # No FMA contraction: the draw must round as the numpy one does.
            extra_compile_args=["-O3", "-ffp-contract=off"],
            optional=True,
        ),
        Extension(
            "service.backends.native._interrupt",
            sources=["service/backends/native/interrupt.c"],
            optional=True,
        ),
    ]
)
