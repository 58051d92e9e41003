#!/usr/bin/env bash
# Build the wheels the images install from: kvtransit and its dependencies, on the host, into
# docker/wheelhouse/ (git-ignored), for the offline compose path: Dockerfile.offline installs with
# `pip install --no-index --find-links`, so a container build needs no network.
#
#   docker/build-wheelhouse.sh
#
# The host's Python must match the image's (3.11: bookworm's python3 and python:3.11-slim), since numpy,
# scipy and pyfftw ship per-version wheels.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out="$repo/docker/wheelhouse"
python=${PYTHON:-python3}
version=$("$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
[ "$version" = 3.11 ] || { echo "host Python is $version; the images run 3.11 (set PYTHON=)" >&2; exit 1; }
mkdir -p "$out"
"$python" -m pip wheel --quiet --wheel-dir "$out" "$repo"
echo "$out"
