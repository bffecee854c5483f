#!/usr/bin/env bash
# What the container tests (tests/test_container_image.py) need, made once per machine:
#
#   make container-prerequisites        (as root, on Debian or Ubuntu)
#
# - a container engine: podman (with runc) from the distribution's packages, unless podman
#   or docker can already run containers here;
# - the base image they build on, localhost/inference-test-base:bookworm: Debian bookworm
#   with Python, made with debootstrap from Debian's packages (these machines reach no
#   image registry, but do reach Debian's mirror).
#
# The tests install nothing themselves: without these they are skipped with the reason
# (in CI, where CI is set, they fail instead).
set -euo pipefail

base=localhost/inference-test-base:bookworm
# What the runtime stage needs from Debian beyond minbase: Python and llama.cpp's runtimes.
packages=python3,python3-venv,libgomp1,libstdc++6,ca-certificates
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

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
[ "$(id -u)" = 0 ] || { echo "debootstrap needs root" >&2; exit 1; }
rootfs=$(mktemp -d)
trap 'rm -rf "$rootfs"' EXIT
debootstrap --variant=minbase --include="$packages" bookworm "$rootfs" "$mirror"
tar -C "$rootfs" -c . | "$engine" import - "$base"
echo "$base: made with $engine"
