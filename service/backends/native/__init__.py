"""C helpers for the llama.cpp backend, built by setuptools and loaded with ctypes."""
