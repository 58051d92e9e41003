#!/usr/bin/env bash
# Build the base image kvtransit's images start FROM when no registry can be reached: a Debian bookworm
# minbase made with debootstrap, imported as kvtransit-base:bookworm.
#
#   docker/build-base.sh [IMAGE]          (default kvtransit-base:bookworm)
#
# The offline compose path's base (docker-compose.offline.yml: KVTRANSIT_OFFLINE_BASE_IMAGE, default
# kvtransit-base:bookworm). With a registry at hand, skip this: the default path builds FROM python:3.11-slim.
# The mirror is read at run time from this host's apt configuration, so no mirror host is written into the
# repository.
set -euo pipefail

image=${1:-kvtransit-base:bookworm}
suite=bookworm
# python3 (3.11 in bookworm) + venv for the wheelhouse install; iproute2 for tc inside the containers.
packages=python3,python3-venv,iproute2

mirror() {
    # deb822 sources (bookworm's default): the first URIs line of the main archive; else a one-line source.
    local uri
    uri=$(grep -h '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' \
          | grep -v -- '-security' | head -n 1 || true)
    if [ -z "$uri" ] && [ -f /etc/apt/sources.list ]; then
        uri=$(awk '$1 == "deb" && $0 !~ /security/ {print ($2 ~ /^\[/ ? $3 : $2); exit}' /etc/apt/sources.list)
    fi
    [ -n "$uri" ] || { echo "no Debian mirror found in apt's sources" >&2; exit 1; }
    echo "$uri"
}

command -v debootstrap >/dev/null || { echo "debootstrap not found: apt-get install debootstrap" >&2; exit 1; }
rootfs=$(mktemp -d /tmp/kvtransit-rootfs.XXXXXX)
trap 'rm -rf --one-file-system "$rootfs"' EXIT
debootstrap --variant=minbase --include="$packages" "$suite" "$rootfs" "$(mirror)" >"$rootfs.log" 2>&1 || {
    tail -n 20 "$rootfs.log" >&2; rm -f "$rootfs.log"; exit 1; }
rm -f "$rootfs.log"
# apt lists and caches are dead weight in an image that never runs apt.
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
tar -C "$rootfs" -c . | docker import - "$image" >/dev/null
echo "$image"
