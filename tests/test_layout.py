"""service/ is laid out so that a newcomer can walk it (issue 29).

Its packages, and the few modules at its root, import each other in one
direction only: no cycles. A cycle (models importing the engine importing
models) means neither can be understood, tested or moved without the other;
the review that split the engine out of the front found four. Imports inside
functions and under TYPE_CHECKING count too, and a root module is a node like
a package: backends -> model_options.py -> backends was a cycle all the same.

The root holds only what several packages share; everything else lives in the
package it belongs to, so the root stays short.
"""

from __future__ import annotations

import ast
from pathlib import Path

SERVICE = Path(__file__).resolve().parent.parent / "service"

# errors, config, log, request_id, memory, model_source, scratch: each is imported
# by several packages (the front and the engine, or hub, admission and models;
# scratch by admission, the llama.cpp backend, images and the front).
MAX_ROOT_MODULES = 7
WHERE_MODULES_GO = """\
a module belongs in the package that uses it: the front process's wiring and
request gates in service/front/, the engine process's in service/engine/, the
decode loop's in service/decode/, grammar and schema checks in service/grammar/,
the pool and catalog in service/models/ (and so on: docs/architecture.md lists
the packages). Only what several packages share belongs at the root."""


def root_modules() -> list[str]:
    return sorted(path.name for path in SERVICE.glob("*.py") if path.name != "__init__.py")


def node_of(module: str) -> str | None:
    """`models` for service.models.pool, `errors.py` for service.errors (a root
    module); None for what is not under service/."""
    parts = module.split(".")
    if len(parts) < 2 or parts[0] != "service":
        return None
    if (SERVICE / parts[1]).is_dir():
        return parts[1]
    if (SERVICE / f"{parts[1]}.py").is_file():
        return f"{parts[1]}.py"
    return None


def imported_modules(module: str, tree: ast.AST) -> set[str]:
    """The modules `module` imports, in any of the forms: `import service.x`,
    `from service.x import y`, `from service import x`, relative imports."""
    found: set[str] = set()
    package = module.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package[: len(package) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            # `from service import errors` imports the module service.errors.
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def package_imports() -> dict[str, set[str]]:
    imports: dict[str, set[str]] = {}
    for path in SERVICE.rglob("*.py"):
        module = ".".join(path.relative_to(SERVICE.parent).with_suffix("").parts)
        source = node_of(module)
        if source is None:
            continue
        for target_module in imported_modules(module, ast.parse(path.read_text())):
            target = node_of(target_module)
            if target is not None and target != source:
                imports.setdefault(source, set()).add(target)
    return imports


def cycles(imports: dict[str, set[str]]) -> list[list[str]]:
    found: list[list[str]] = []

    def walk(path: list[str]) -> None:
        for target in sorted(imports.get(path[-1], ())):
            if target == path[0]:
                found.append([*path, target])
            elif target not in path and target > path[0]:  # each cycle once
                walk([*path, target])

    for start in sorted(imports):
        walk([start])
    return found


def test_no_package_or_root_module_imports_itself_back() -> None:
    assert cycles(package_imports()) == []


def test_the_root_of_service_stays_short() -> None:
    modules = root_modules()
    assert len(modules) <= MAX_ROOT_MODULES, (
        f"service/ has {len(modules)} root modules, at most {MAX_ROOT_MODULES}: "
        f"{', '.join(modules)}.\n{WHERE_MODULES_GO}"
    )


def test_the_check_sees_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    imports = package_imports()
    assert imports["engine"] >= {"backends", "decode", "errors.py"}
    # Root modules are nodes: a cycle through one is seen.
    assert imports["models"] >= {"config.py", "memory.py", "model_source.py"}
    assert imports["config.py"] >= {"backends"}


def test_every_form_of_import_is_seen() -> None:
    tree = ast.parse(
        "import service.front.server\n"
        "from service import errors\n"
        "from service.decode.sink import EventSink\n"
        "from . import framing\n"
        "from ..models import pool\n"
        "def lazily() -> None:\n"
        "    from service.grammar.compile import resolve_grammar\n"
    )
    targets = {node_of(module) for module in imported_modules("service.engine.wire", tree)}
    assert targets - {None} == {"front", "errors.py", "decode", "engine", "models", "grammar"}
