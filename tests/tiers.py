"""The suite's tiers: each test's markers, from what it uses, given at collection.

What a test uses is what its own code, its fixtures' code, and the helpers in tests/
they call refer to, followed through tests/ (not into service/: the service may well
refer to a backend, and a test that calls it with a fake does not load one). A test
that reaches one of the `SEAMS` below gets that seam's marker, and every test with a
marker also gets `slow`: `make test-fast` runs `-m "not slow"`. A module whose tests are
slow for another reason (thousands of draws, a subprocess per test) marks itself
`slow` with `pytestmark`, and says why.

Reaching counts references, not calls: a test that names `serving` in a branch it
never takes is still a server test. The fast tier may lose a test that way; it never
gains one that loads a model.
"""

from __future__ import annotations

import inspect
import sys
import types
from collections.abc import Iterable, Iterator
from typing import Any

import pytest

TIERS = {
    "server": "starts a server (in this process or its own), and so an engine with a real model",
    "model": "loads a real model: llama.cpp, mlx-lm or diffusers, in this process or an engine's",
    "cluster": "starts inference-cluster: replicas, the endpoint picker and Envoy",
    "container": "builds and runs the container image (needs podman or docker)",
    "slow": "left out of `make test-fast`: every test marked above, and a few slow by nature",
}

# Where a test leaves the fast tier: a function or class, by the module that defines it
# and its qualified name, and the marker reaching it gives.
SEAMS = {
    "tests.conftest.RunningServer": "server",
    "tests.conftest.serving": "server",
    "tests.server_process.server_process": "server",
    "service.front.server.InferenceServer": "server",
    "tests.cluster_process.cluster_process": "cluster",
    "tests.container.container_engine": "container",
    "llama_cpp.llama.Llama": "model",
    "service.backends.llama_cpp.backend.LlamaCppBackend": "model",
    "service.backends.mlx_lm.MlxLmBackend": "model",
    "service.backends.diffusers_pipeline.DiffusersBackend": "model",
    "service.engine.loading.load_backend": "model",
    "service.engine.local.LocalEngine": "model",
    "service.engine.process.EngineProcess": "model",
    "tests.tiny_pipeline.build_tiny_sd_pipeline": "model",
    "tests.mlx_checkpoint.build_tiny_checkpoint": "model",
    "tests.llama_child.load_in_children": "model",
    "mlx_lm.utils.load": "model",
}


def register(config: pytest.Config) -> None:
    for name, meaning in TIERS.items():
        config.addinivalue_line("markers", f"{name}: {meaning}")


def mark(items: Iterable[pytest.Item]) -> None:
    """Give each test the markers of the seams it reaches, and `slow` with any of them."""
    cache: dict[int, frozenset[str]] = {}
    for item in items:
        markers = set().union(*(_reached(code, cache) for code in _code_of(item)))
        for name in sorted(markers):
            item.add_marker(name)
        if markers:
            item.add_marker("slow")


def markers_of(function: Any) -> frozenset[str]:
    """The markers reaching from one function gives (for tests of this module)."""
    return _reached(_code(function), {})


def _code_of(item: pytest.Item) -> Iterator[tuple[types.CodeType, dict[str, Any]]]:
    """The test function's code, and its fixtures' code defined in tests/."""
    function = getattr(item, "function", None)
    if function is None:
        return
    yield _code(function)
    info = getattr(item, "_fixtureinfo", None)
    definitions = info.name2fixturedefs if info is not None else {}
    for name in getattr(item, "fixturenames", ()):
        for definition in definitions.get(name, ()):
            if _defined_in_tests(definition.func):
                yield _code(definition.func)


def _code(function: Any) -> tuple[types.CodeType, dict[str, Any]]:
    unwrapped = inspect.unwrap(function)
    return unwrapped.__code__, unwrapped.__globals__


def _reached(
    target: tuple[types.CodeType, dict[str, Any]], cache: dict[int, frozenset[str]]
) -> frozenset[str]:
    code, namespace = target
    if id(code) in cache:
        return cache[id(code)]
    cache[id(code)] = frozenset()  # a cycle reaches nothing more the second time round
    found: set[str] = set()
    for name, value in _references(code, namespace):
        if name in SEAMS:
            found.add(SEAMS[name])
        for inner in _bodies(value):
            found |= _reached(inner, cache)
    for constant in code.co_consts:  # nested functions, lambdas, comprehensions
        if isinstance(constant, types.CodeType):
            found |= _reached((constant, namespace), cache)
    cache[id(code)] = frozenset(found)
    return cache[id(code)]


def _references(code: types.CodeType, namespace: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """(qualified name, object or None) of what the code may refer to: its globals, their
    attributes when they are modules or classes, and names imported from modules; an
    import that has not run yet (a heavy module imported inside a fixture) is named
    without being imported. Names, not bytecode: a pair of names that meet by chance
    can only move a test out of the fast tier."""
    names = code.co_names
    for name in names:
        value = namespace.get(name)
        if value is None:
            if name in sys.modules or "." in name:  # `import name` or `from name import ...`
                yield from _attributes(sys.modules.get(name), name, names)
            continue
        yield _qualified(value), value
        if isinstance(value, type | types.ModuleType):
            yield from _attributes(value, _qualified(value), names)


def _attributes(owner: Any, prefix: str, names: tuple[str, ...]) -> Iterator[tuple[str, Any]]:
    for name in names:
        value = getattr(owner, name, None) if owner is not None else None
        if value is None:
            yield f"{prefix}.{name}", None
        elif callable(value):
            yield _qualified(value), value


def _qualified(value: Any) -> str:
    if isinstance(value, types.ModuleType):
        return value.__name__
    return f"{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', '')}"


def _bodies(value: Any) -> Iterator[tuple[types.CodeType, dict[str, Any]]]:
    """The code to follow into: functions and classes defined in tests/."""
    if value is None or not _defined_in_tests(value):
        return
    if inspect.isclass(value):
        for attribute in vars(value).values():
            inner = getattr(attribute, "__func__", attribute)  # static and class methods
            if inspect.isfunction(inner):
                yield _code(inner)
        return
    if inspect.isfunction(value) or inspect.isfunction(inspect.unwrap(value)):
        yield _code(value)


def _defined_in_tests(value: Any) -> bool:
    module = getattr(value, "__module__", None) or ""
    return module == "tests" or module.startswith("tests.") or module == "conftest"
