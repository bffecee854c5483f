"""The one compiled piece; everything else about the package is in pyproject.toml.

llama.cpp's log filter (service/backends/llama_cpp/log.py says why it is C): a plain
shared library loaded with ctypes, so it needs a C compiler but no Python headers.
It is optional: where it cannot be built, a filter in Python does the same work.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "service.backends.native._log_filter",
            sources=["service/backends/native/log_filter.c"],
            optional=True,
        )
    ]
)
