"""The socket options every kvtransit TCP connection gets, dialled or accepted: how a silent peer is found.

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
