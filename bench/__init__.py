"""Benchmarks: the service side by side with the raw library, in one run."""
