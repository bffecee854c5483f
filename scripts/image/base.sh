#!/usr/bin/env bash
# A base image for the service's image where no image registry is reachable (the
# Dockerfile's default, python:3.11-slim-bookworm, is pulled from one): Debian bookworm
# with Python and llama.cpp's runtimes, made with debootstrap from Debian's packages.
#
#   scripts/image/base.sh [NAME]     (make image-base; NAME defaults to
#                                     localhost/inference-base:bookworm)
#   make image BASE=NAME             (then the service's image on it)
#
# As root, with debootstrap and podman or docker (make container-prerequisites installs
# both on Debian or Ubuntu, and makes the container tests' base with this script). It
# needs Debian's mirror (DEBIAN_MIRROR, default deb.debian.org), about a minute, and
# leaves out what a runtime never reads: apt's package lists and downloaded packages,
# documentation but the copyright files, manual pages and translations (about 140 MiB
# of the 270 a plain minbase with Python holds); later apt installs leave them out too.
set -euo pipefail

base=${1:-localhost/inference-base:bookworm}
# What the runtime stage needs from Debian beyond minbase: Python and llama.cpp's runtimes.
packages=python3,python3-venv,libgomp1,libstdc++6,ca-certificates
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

engine=${ENGINE:-}
if [ -z "$engine" ]; then
    for candidate in podman docker; do
        if command -v "$candidate" >/dev/null && "$candidate" info >/dev/null 2>&1; then
            engine=$(command -v "$candidate")
            break
        fi
    done
fi
[ -n "$engine" ] || { echo "neither podman nor docker can run containers here" >&2; exit 1; }
command -v debootstrap >/dev/null || { echo "debootstrap is not installed" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "debootstrap needs root" >&2; exit 1; }

rootfs=$(mktemp -d)
trap 'rm -rf "$rootfs"' EXIT
debootstrap --variant=minbase --include="$packages" bookworm "$rootfs" "$mirror"

# As Debian's own slim images do: dpkg skips these paths from now on, and what the
# packages above installed there goes.
cat >"$rootfs/etc/dpkg/dpkg.cfg.d/excludes" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*
EOF
find "$rootfs/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
find "$rootfs/usr/share/doc" -mindepth 1 -type d -empty -delete
rm -rf "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* "$rootfs"/usr/share/locale/* \
    "$rootfs"/usr/share/lintian/* "$rootfs"/var/cache/apt/* "$rootfs"/var/lib/apt/lists/*

tar -C "$rootfs" -c . | "$engine" import - "$base" >/dev/null
"$engine" image inspect --format '{{.Size}}' "$base" | awk -v base="$base" \
    '{ printf "%s: %.0f MiB, made with debootstrap\n", base, $1 / 1048576 }'
