"""Writes every file generated from protos/: what `make protos` runs.

One list of outputs, so that the Makefile and the check that the committed files are
fresh (tests/test_protos.py, which runs this into a temporary folder) cannot drift:

- the Python stubs of the contract and of the engine protocol, in inference/;
- the contract's descriptor set with its imports, inference/v1/inference.binpb, which
  Envoy's gRPC-JSON transcoder reads (docs/api.md);
- the Node.js client's src/gen/ (protoc-gen-es from clients/node's npm packages);
- the Go client's clients/go/inference/v1/ (protoc-gen-go and protoc-gen-go-grpc).

A plugin that is not installed is skipped with a line saying so, never silently.
Every run uses grpc_tools' protoc, whose version is pinned (pyproject.toml), so the
output is the same on every machine. Usage: python scripts/protos.py [--out DIR].
"""

from __future__ import annotations

import argparse
import shutil
import sys
from importlib import resources
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
# protos/ holds the vendored google/api protos too (protos/google/README.md): one copy
# for protoc and buf. Then google/protobuf's own (descriptor.proto, which google/api
# imports), as grpc_tools ships them: `python -m grpc_tools.protoc` adds them itself,
# protoc.main does not.
INCLUDES = (ROOT / "protos", Path(str(resources.files("grpc_tools") / "_proto")))
CONTRACT = "inference/v1/inference.proto"
ENGINE = "inference/engine/v1/engine.proto"
GOOGLE_API = ("google/api/annotations.proto", "google/api/http.proto")
DESCRIPTOR_SET = Path("inference/v1/inference.binpb")
NODE_GEN = Path("clients/node/src/gen")
NODE_PLUGIN = ROOT / "clients" / "node" / "node_modules" / ".bin" / "protoc-gen-es"
GO_CLIENT = Path("clients/go")
# go.mod's module path; go_package in the contract lies under it.
GO_MODULE = "github.com/inference-service/inference-service/clients/go"
GO_PLUGINS = ("protoc-gen-go", "protoc-gen-go-grpc")


def run_protoc(*arguments: str) -> None:
    includes = [f"-I{path}" for path in INCLUDES]
    if protoc.main(["grpc_tools.protoc", *includes, *arguments]) != 0:
        sys.exit(f"protoc failed: {' '.join(arguments)}")


def python_stubs(out: Path) -> None:
    run_protoc(f"--python_out={out}", f"--pyi_out={out}", f"--grpc_python_out={out}", CONTRACT)
    # The engine protocol has no service: messages only.
    run_protoc(f"--python_out={out}", f"--pyi_out={out}", ENGINE)


def descriptor_set(out: Path) -> None:
    # With its imports, so a reader needs no other file (Envoy takes exactly one).
    target = out / DESCRIPTOR_SET
    target.parent.mkdir(parents=True, exist_ok=True)
    run_protoc("--include_imports", f"--descriptor_set_out={target}", CONTRACT)


def node_client(out: Path) -> bool:
    if not NODE_PLUGIN.exists():
        print(f"skipped the Node.js client: {NODE_PLUGIN} is missing (make install)")
        return False
    target = out / NODE_GEN
    target.mkdir(parents=True, exist_ok=True)
    # google/api's own modules too: the contract's generated module imports them.
    run_protoc(
        f"--plugin=protoc-gen-es={NODE_PLUGIN}",
        f"--es_out={target}",
        "--es_opt=target=js+dts,import_extension=js",
        CONTRACT,
        *GOOGLE_API,
    )
    return True


def go_client(out: Path) -> bool:
    missing = [name for name in GO_PLUGINS if shutil.which(name) is None]
    if missing:
        print(f"skipped the Go client: {', '.join(missing)} not on PATH (clients/go/README.md)")
        return False
    target = out / GO_CLIENT
    target.mkdir(parents=True, exist_ok=True)
    # google/api's Go package is google.golang.org/genproto's, not generated here.
    run_protoc(
        f"--go_out={target}",
        f"--go_opt=module={GO_MODULE}",
        f"--go-grpc_out={target}",
        f"--go-grpc_opt=module={GO_MODULE}",
        CONTRACT,
    )
    return True


def generate(out: Path) -> None:
    python_stubs(out)
    descriptor_set(out)
    node_client(out)
    go_client(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT, help="root to write under")
    generate(parser.parse_args().out.resolve())


if __name__ == "__main__":
    main()
