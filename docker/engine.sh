#!/usr/bin/env bash
# Start and stop a private Docker engine for the compose tests, and undo everything it did to the host.
#
#   docker/engine.sh start STATE_DIR   dockerd with its data, exec root, pid file and socket under STATE_DIR;
#                                      prints `export DOCKER_HOST=unix://STATE_DIR/docker.sock`
#   docker/engine.sh stop STATE_DIR    stop that dockerd by its pid, delete exactly the nftables tables and
#                                      the docker0 and docker_gwbridge bridges it created, restore ip_forward,
#                                      remove STATE_DIR
#
# Why private: the engine is Debian's, started by hand (no systemd here), and must not meet an engine a user
# already runs: its own socket, pid file and data root keep the two apart. Why the bookkeeping: an engine
# started with iptables leaves `FORWARD DROP` and its chains in nftables tables, and sets ip_forward=1; a
# later engine without iptables then silently drops container traffic (benchmarks/RESULTS.md, "Docker on this machine").
# Before starting, we record what existed; stopping removes only what did not. Swarm mode (tests/system/
# test_swarm_stack.py) adds one more: `docker swarm leave --force` leaves the docker_gwbridge link behind.
set -euo pipefail

# dockerd answers `docker info` within a second here; 60 s covers a loaded CI box.
READY_TIMEOUT_S=60
# SIGTERM lets dockerd stop its containers and containerd; after this it is killed.
STOP_TIMEOUT_S=30

usage() { echo "usage: $0 start|stop STATE_DIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
action=$1
state=$2

nft_tables() { nft list tables 2>/dev/null | sort || true; }
has_link() { ip link show "$1" >/dev/null 2>&1; }

start() {
    command -v dockerd >/dev/null || { echo "dockerd not found: apt-get install docker.io" >&2; exit 1; }
    [ ! -e "$state/dockerd.pid" ] || { echo "$state already holds an engine (dockerd.pid exists)" >&2; exit 1; }
    mkdir -p "$state"
    nft_tables >"$state/nft-tables.before"
    cat /proc/sys/net/ipv4/ip_forward >"$state/ip_forward.before"
    for link in docker0 docker_gwbridge; do
        if has_link "$link"; then echo yes; else echo no; fi >"$state/$link.before"
    done
    # overlay2: vfs copies the whole image per container (4 GB for this testbed, measured).
    setsid dockerd \
        --host "unix://$state/docker.sock" \
        --data-root "$state/data" \
        --exec-root "$state/exec" \
        --pidfile "$state/dockerd.pidfile" \
        --storage-driver overlay2 \
        >"$state/dockerd.log" 2>&1 </dev/null &
    echo $! >"$state/dockerd.pid"
    export DOCKER_HOST="unix://$state/docker.sock"
    for _ in $(seq $((READY_TIMEOUT_S * 10))); do
        if docker info >/dev/null 2>&1; then
            echo "export DOCKER_HOST=$DOCKER_HOST"
            return 0
        fi
        kill -0 "$(cat "$state/dockerd.pid")" 2>/dev/null || break
        sleep 0.1
    done
    echo "dockerd did not become ready; its log:" >&2
    tail -n 20 "$state/dockerd.log" >&2
    stop
    exit 1
}

stop() {
    [ -d "$state" ] || { echo "no engine state in $state" >&2; exit 1; }
    if [ -f "$state/dockerd.pid" ]; then
        pid=$(cat "$state/dockerd.pid")
        if kill -0 "$pid" 2>/dev/null; then
            kill -TERM "$pid"
            for _ in $(seq $((STOP_TIMEOUT_S * 10))); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
            kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
        fi
        rm -f "$state/dockerd.pid"
    fi
    # Tables that were not there before the engine: its own. A table that was there stays (not ours).
    if [ -f "$state/nft-tables.before" ]; then
        comm -13 "$state/nft-tables.before" <(nft_tables) | while read -r _table family name; do
            nft delete table "$family" "$name"
        done
    fi
    # The bridges the engine made (docker0; docker_gwbridge, by swarm), each by its exact name.
    for link in docker0 docker_gwbridge; do
        if [ "$(cat "$state/$link.before" 2>/dev/null)" = no ] && has_link "$link"; then
            ip link delete "$link"
        fi
    done
    if [ -f "$state/ip_forward.before" ]; then
        cat "$state/ip_forward.before" >/proc/sys/net/ipv4/ip_forward
    fi
    # The data root holds overlay mounts only while containers run; the engine has stopped them. Unmount any
    # left by a killed engine before deleting (rm would fail on a busy mount, never cross it: --one-file-system).
    if [ -d "$state/data" ]; then
        awk -v root="$state/" 'index($2, root) == 1 {print $2}' /proc/mounts | sort -r | while read -r m; do
            umount -l "$m" || true
        done
    fi
    rm -rf --one-file-system "$state"
}

case "$action" in
    start) start ;;
    stop) stop ;;
    *) usage ;;
esac
