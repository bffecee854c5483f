"""The compiled pieces; everything else about the package is in pyproject.toml.

Two plain shared libraries loaded with ctypes, so they need a C compiler but no
Python headers: llama.cpp's log filter (service/backends/llama_cpp/log.py says why
it is C) and the batched sampler's draw (service/backends/native/sampler.c). Both
are optional: where they cannot be built, Python and numpy do the same work, slower.
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
    ]
)
