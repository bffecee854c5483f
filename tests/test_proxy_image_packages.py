"""The proxy image installs what inference-picker imports, and nothing of the server.

Dockerfile.proxy installs the project's wheel without its dependencies, and
scripts/image/proxy-requirements.txt's packages with theirs. A new import in the
picker of a package outside that set would start the proxy pods' picker with an
ImportError; the container tier would find it, this finds it in the fast tier.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS = ROOT / "scripts" / "image" / "proxy-requirements.txt"
# Imported only when installed, each inside a try: rich and its pygments and attrs
# for structlog's tracebacks, grpcio-tools by grpc for protos loaded at run time.
OPTIONAL = {"rich", "pygments", "attrs", "grpcio-tools"}
# What the proxy image must not hold: the server's weight.
SERVER_ONLY = {"llama-cpp-python", "numpy", "gguf", "aiohttp", "huggingface-hub"}

_IMPORTED = """
import importlib.metadata, json, sys
before = set(sys.modules)
import service.cluster.picker
names = {m.split(".")[0] for m in set(sys.modules) - before}
owners = importlib.metadata.packages_distributions()
print(json.dumps(sorted({d for n in names for d in owners.get(n, [])})))
"""


def listed() -> set[str]:
    lines = REQUIREMENTS.read_text().splitlines()
    return {canonicalize_name(line) for line in lines if line and not line.startswith("#")}


def with_dependencies(names: set[str]) -> set[str]:
    """`names` and everything they need, as the installed packages' metadata says."""
    found: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found.add(name)
        for text in importlib.metadata.requires(name) or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(canonicalize_name(requirement.name))
    return found


def picker_imports() -> set[str]:
    """The distributions a fresh interpreter imports to load the picker."""
    done = subprocess.run(
        [sys.executable, "-c", _IMPORTED], capture_output=True, text=True, check=True, cwd=ROOT
    )
    return {canonicalize_name(name) for name in json.loads(done.stdout)}


def test_the_proxy_image_holds_every_package_the_picker_imports() -> None:
    installed = with_dependencies(listed()) | {"inference-service"}
    missing = picker_imports() - installed - OPTIONAL
    assert not missing, f"add to {REQUIREMENTS.relative_to(ROOT)}: {sorted(missing)}"


def test_the_proxy_image_holds_nothing_of_the_server() -> None:
    assert not with_dependencies(listed()) & SERVER_ONLY
