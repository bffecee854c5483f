"""The committed generated files are exactly what `make protos` writes from the contract.

`make protos` is scripts/protos.py; here it writes into a temporary folder, and every
file it writes must equal the committed one (and no committed one be left over), so a
.proto edited without regenerating fails here. The descriptor set Envoy's transcoder
reads is checked for what it is for: every RPC mapped onto HTTP under /inference/v1/.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from google.api import annotations_pb2
from google.protobuf import descriptor_pb2

ROOT = Path(__file__).resolve().parent.parent
GENERATOR = ROOT / "scripts" / "protos.py"
NODE_PLUGIN = ROOT / "clients" / "node" / "node_modules" / ".bin" / "protoc-gen-es"
GO_PLUGINS = ("protoc-gen-go", "protoc-gen-go-grpc")
# The OpenAI-compatible HTTP API the same Envoy port serves (docs/http.md).
OPENAI_PATHS = ("/v1/", "/health", "/tokenize", "/detokenize")


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("protos")
    done = subprocess.run(
        [sys.executable, str(GENERATOR), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def generated(root: Path, folder: str, patterns: tuple[str, ...]) -> list[Path]:
    return sorted(
        path.relative_to(root) for pattern in patterns for path in (root / folder).rglob(pattern)
    )


def assert_same_folder(fresh: Path, folder: str, *patterns: str) -> None:
    written = generated(fresh, folder, patterns)
    committed = generated(ROOT, folder, patterns)
    assert written, f"scripts/protos.py wrote nothing under {folder}"
    assert committed == written, f"{folder}: generated files differ from the committed ones"
    for name in written:
        if (fresh / name).read_bytes() != (ROOT / name).read_bytes():
            pytest.fail(f"{name} is stale: run `make protos` and commit the result")


def test_committed_python_stubs_match_the_contract(fresh: Path) -> None:
    assert_same_folder(fresh, "inference", "*_pb2.py", "*_pb2.pyi", "*_pb2_grpc.py")


def test_committed_descriptor_set_matches_the_contract(fresh: Path) -> None:
    assert_same_folder(fresh, "inference", "*.binpb")


@pytest.mark.skipif(
    not NODE_PLUGIN.exists(), reason="the Node.js client's npm packages are not installed"
)
def test_committed_node_client_matches_the_contract(fresh: Path) -> None:
    assert_same_folder(fresh, "clients/node/src/gen", "*_pb.*")


@pytest.mark.skipif(
    any(shutil.which(name) is None for name in GO_PLUGINS),
    reason="protoc-gen-go and protoc-gen-go-grpc are not installed (clients/go/README.md)",
)
def test_committed_go_client_matches_the_contract(fresh: Path) -> None:
    assert_same_folder(fresh, "clients/go/inference", "*.pb.go")


def committed_service() -> tuple[
    descriptor_pb2.FileDescriptorSet, descriptor_pb2.ServiceDescriptorProto
]:
    files = descriptor_pb2.FileDescriptorSet.FromString(
        (ROOT / "inference" / "v1" / "inference.binpb").read_bytes()
    )
    contract = next(f for f in files.file if f.name == "inference/v1/inference.proto")
    return files, next(s for s in contract.service if s.name == "Inference")


def test_the_descriptor_set_holds_its_imports() -> None:
    # Envoy reads this one file: whatever the contract imports must be inside it.
    files, _ = committed_service()
    names = {f.name for f in files.file}
    assert {"google/api/annotations.proto", "google/api/http.proto"} <= names
    for f in files.file:
        assert set(f.dependency) <= names, f.name


def test_every_rpc_has_an_http_mapping_clear_of_the_openai_paths() -> None:
    _, service = committed_service()
    routes = []
    for method in service.method:
        rule = method.options.Extensions[annotations_pb2.http]
        verb = rule.WhichOneof("pattern")
        assert verb is not None, f"{method.name} has no google.api.http option"
        path = getattr(rule, verb)
        assert path.startswith("/inference/v1/"), (method.name, path)
        assert not path.startswith(OPENAI_PATHS)
        # A GET or DELETE has no body; everything else takes the whole request as JSON.
        assert rule.body == ("" if verb in ("get", "delete") else "*"), method.name
        routes.append((verb, path))
    assert len(set(routes)) == len(routes), "two RPCs share a route"
