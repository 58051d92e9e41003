"""The socket options every kvtransit TCP connection gets, dialled or accepted: how a silent peer is found, and
which congestion controller sends (LINK_CONGESTION_CONTROL).

A host or link gone without a FIN or RST is found by TCP itself: keepalive probes after KEEPALIVE_IDLE_S of
silence, KEEPALIVE_INTERVAL_S apart, KEEPALIVE_PROBES of them (dead after ~8 s idle); and TCP_USER_TIMEOUT
drops a connection whose sent data stays unacknowledged for USER_TIMEOUT_S. Both are above the chaos
suite's 2 s link outage, which TCP rides out by retransmitting. `FramedProtocol.connection_made` applies
them, so no path that makes a connection can forget to.
"""

from __future__ import annotations

import contextlib
import socket
from typing import Any

KEEPALIVE_IDLE_S = 5
KEEPALIVE_INTERVAL_S = 1
KEEPALIVE_PROBES = 3
USER_TIMEOUT_S = 10


def keep_alive(sock: Any) -> None:
    """Turn on TCP keepalive and the user timeout on a TCP socket (anything else, e.g. in memory: nothing)."""
    if sock is None or getattr(sock, "type", None) != socket.SOCK_STREAM \
            or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    for name, value in (("TCP_KEEPIDLE", KEEPALIVE_IDLE_S), ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL_S),
                        ("TCP_KEEPCNT", KEEPALIVE_PROBES), ("TCP_USER_TIMEOUT", USER_TIMEOUT_S * 1000)):
        if hasattr(socket, name):  # Linux has all four; elsewhere keepalive alone, with the OS's timers
            options.append((socket.IPPROTO_TCP, getattr(socket, name), value))
    for level, option, value in options:
        with contextlib.suppress(OSError):
            sock.setsockopt(level, option, value)


# Every kvtransit TCP socket runs CUBIC, a loss-based controller that does not pace: each hop is either the shaped
# link itself or a host-internal hop feeding it, and the modelled link (docs/reference.md §2) carries latency + bytes /
# rate from a transfer's first byte, so the link's shaper (tbf, or our token bucket) must be what paces the KV, not a
# sender's congestion controller. This host's default, BBR, paces at its own bandwidth estimate, which lags after an
# idle gap (and cycles below it to drain the queue it measured). Measured between two namespaces through tbf (2 MB
# transfers at 50 MB/s after idle gaps of 0.05–1.3 s, tcp_slow_start_after_idle = 0 as shaping/commands.py sets it,
# interleaved runs): after the gaps of 0.8 s and more, BBR ran +0.9 to +13 ms over bytes / rate, CUBIC +0.7 to +8 ms;
# after short gaps both stay within ±0.7 ms. No packet was dropped by tbf either way.
LINK_CONGESTION_CONTROL = "cubic"


def congestion_control(sock: Any) -> str | None:
    """The congestion controller a TCP socket runs (None: not a TCP socket)."""
    if sock is None or getattr(sock, "type", None) != socket.SOCK_STREAM or not hasattr(socket, "TCP_CONGESTION"):
        return None
    try:
        return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).split(b"\0", 1)[0].decode()
    except OSError:
        return None


def use_congestion_control(sock: Any, name: str) -> str | None:
    """Ask for congestion controller `name` on a TCP socket; returns the one in force after. A host that refuses
    (`name` not available, or not in net.ipv4.tcp_allowed_congestion_control for a process without CAP_NET_ADMIN)
    leaves the socket on its default, and the caller says so."""
    if congestion_control(sock) is None:
        return None
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, name.encode())
    return congestion_control(sock)
