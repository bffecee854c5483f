"""The packages under service/ import each other in one direction only: no cycles.

A cycle (models importing the engine importing models) means neither can be
understood, tested or moved without the other; the review that split the
engine out of the front found four. Imports inside functions count too.
"""

from __future__ import annotations

import ast
from pathlib import Path

SERVICE = Path(__file__).resolve().parent.parent / "service"


def package_of(module: str) -> str | None:
    """`models` for service.models.pool; None for a top-level module (service.front.server)."""
    parts = module.split(".")
    if len(parts) < 2 or not (SERVICE / parts[1]).is_dir():
        return None
    return parts[1]


def package_imports() -> dict[str, set[str]]:
    imports: dict[str, set[str]] = {}
    for path in SERVICE.rglob("*.py"):
        module = ".".join(path.relative_to(SERVICE.parent).with_suffix("").parts)
        source = package_of(module)
        if source is None:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("service."):
                target = package_of(node.module or "")
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


def test_no_package_imports_itself_back() -> None:
    assert cycles(package_imports()) == []


def test_the_check_sees_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert package_imports()["engine"] >= {"backends", "decode"}
