"""Write base/envoy-configmap.yaml from service/cluster/envoy.yaml.j2, and the config's
sha256 on Envoy's pod template in base/envoy-deployment.yaml.

    .venv/bin/python deploy/kubernetes/render_envoy_configmap.py          # rewrite both
    .venv/bin/python deploy/kubernetes/render_envoy_configmap.py --check  # exit 1 if stale

The renderer's arguments (`python -m service.cluster.envoy_config --help`) are the
ConfigMap's `inference-service/envoy-config-args` annotation: to change them, edit it
and run this. tests/test_kubernetes_files.py fails while either file is stale.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shlex
import sys
from pathlib import Path

import yaml

from service.cluster.envoy_config import layout_from_args, render

HERE = Path(__file__).resolve().parent
CONFIGMAP = HERE / "base" / "envoy-configmap.yaml"
DEPLOYMENT = HERE / "base" / "envoy-deployment.yaml"
ARGS_ANNOTATION = "inference-service/envoy-config-args"
SHA_ANNOTATION = "inference-service/envoy-config-sha256"
KEY = "envoy.yaml"

CONFIGMAP_HEAD = """\
# Envoy's configuration: what `python -m service.cluster.envoy_config` renders with the
# arguments in the annotation below. Written by render_envoy_configmap.py: edit
# service/cluster/envoy.yaml.j2 or the arguments, then run it (../README.md).
apiVersion: v1
kind: ConfigMap
metadata:
  name: inference-envoy
  labels:
    app.kubernetes.io/name: inference-envoy
    app.kubernetes.io/part-of: inference-service
  annotations:
    {annotation}: {args}
data:
  {key}: |{indicator}
"""


def recorded_args(configmap: Path = CONFIGMAP) -> list[str]:
    """The renderer's arguments, as the committed ConfigMap records them."""
    document = yaml.safe_load(configmap.read_text())
    return shlex.split(document["metadata"]["annotations"][ARGS_ANNOTATION])


def rendered(args: list[str]) -> str:
    return render(layout_from_args(args))


def config_sha256(config: str) -> str:
    return hashlib.sha256(config.encode()).hexdigest()


def configmap_text(args: list[str], config: str) -> str:
    """The ConfigMap file: `config` as a literal block that reads back unchanged."""
    if not config.endswith("\n") or config.endswith("\n\n"):
        raise ValueError("the rendered config must end with exactly one newline")
    indicator = "2" if config.startswith((" ", "\n")) else ""
    head = CONFIGMAP_HEAD.format(
        args=json.dumps(shlex.join(args)), annotation=ARGS_ANNOTATION, key=KEY, indicator=indicator
    )
    body = "".join(f"    {line}" if line.strip() else "\n" for line in config.splitlines(True))
    text = head + body
    if yaml.safe_load(text)["data"][KEY] != config:
        raise ValueError("the rendered config does not survive a YAML literal block")
    return text


def deployment_text(current: str, sha: str) -> str:
    pattern = re.compile(rf'^(\s*{re.escape(SHA_ANNOTATION)}: )"[0-9a-f]*"$', re.MULTILINE)
    text, count = pattern.subn(rf'\g<1>"{sha}"', current)
    if count != 1:
        raise ValueError(f"{DEPLOYMENT.name} must have one {SHA_ANNOTATION} annotation")
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a file is stale")
    check = parser.parse_args(argv).check
    args = recorded_args()
    config = rendered(args)
    wanted = {
        CONFIGMAP: configmap_text(args, config),
        DEPLOYMENT: deployment_text(DEPLOYMENT.read_text(), config_sha256(config)),
    }
    stale = [path for path, text in wanted.items() if path.read_text() != text]
    for path in stale:
        if check:
            print(f"{path.name} is stale: run {Path(__file__).name}", file=sys.stderr)
        else:
            path.write_text(wanted[path])
            print(f"wrote {path.name}")
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
