#!/usr/bin/env bash
# What the container tests (tests/test_container_image.py) need, made once per machine:
#
#   make container-prerequisites        (as root, on Debian or Ubuntu)
#
# - a container engine: podman (with runc) from the distribution's packages, unless podman
#   or docker can already run containers here;
# - the base image they build on, localhost/inference-test-base:bookworm: Debian bookworm
#   with Python, made with debootstrap from Debian's packages by scripts/image/base.sh (as
#   `make image-base` makes one for `make image` where no registry is reachable: these
#   machines reach none, but do reach Debian's mirror).
#
# The tests install nothing themselves: without these they are skipped with the reason
# (in CI, where CI is set, they fail instead).
set -euo pipefail

base=localhost/inference-test-base:bookworm

can_run() { command -v "$1" >/dev/null && "$1" info >/dev/null 2>&1; }

engine=""
for candidate in podman docker; do
    if can_run "$candidate"; then engine=$(command -v "$candidate"); break; fi
done
need=()
[ -n "$engine" ] || need+=(podman runc)
command -v debootstrap >/dev/null || need+=(debootstrap)
if [ ${#need[@]} -gt 0 ]; then
    [ "$(id -u)" = 0 ] || { echo "installing ${need[*]} needs root" >&2; exit 1; }
    command -v apt-get >/dev/null || { echo "install ${need[*]} by hand: no apt-get" >&2; exit 1; }
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
fi
if [ -z "$engine" ]; then
    can_run podman || { echo "podman is installed but cannot run containers here" >&2; exit 1; }
    engine=$(command -v podman)
fi

if "$engine" image inspect "$base" >/dev/null 2>&1; then
    echo "$base: there already"
    exit 0
fi
ENGINE=$engine "$(dirname "$0")/base.sh" "$base"
