#!/usr/bin/env bash
# Put Debian's prometheus binary into docker/prometheus-bin/ (git-ignored) for docker/prometheus.Dockerfile:
# `apt-get download` + `dpkg-deb -x`. The binary links only libc, so it runs on the bookworm base as it is.
#
#   docker/fetch-prometheus.sh
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out="$repo/docker/prometheus-bin"
work=$(mktemp -d /tmp/kvtransit-prometheus-deb.XXXXXX)
chmod 777 "$work"  # apt-get download drops privileges to _apt, which must be able to write here
trap 'rm -rf --one-file-system "$work"' EXIT
(cd "$work" && apt-get download prometheus >/dev/null)
dpkg-deb -x "$work"/prometheus_*.deb "$work/root"
mkdir -p "$out"
cp "$work/root/usr/bin/prometheus" "$out/prometheus"
echo "$out/prometheus"
