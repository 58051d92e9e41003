"""Every kvtransit TCP socket runs the congestion controller that leaves pacing to the link's shaper (CUBIC), and
says which one it runs; a socket that is not TCP is left alone."""

from __future__ import annotations

import asyncio
import os
import socket

import pytest

from kvtransit.runtime.transport import open_endpoint
from kvtransit.runtime.transport.protocol import DEFAULT_LIMITS, FramedProtocol, wire_connection
from kvtransit.runtime.transport.tcp_options import LINK_CONGESTION_CONTROL, congestion_control, use_congestion_control
from kvtransit.wire.events import Role

AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="choosing a controller outside the allowed list needs "
                                                       "CAP_NET_ADMIN (root here and in CI)")


def _available() -> set[str]:
    with open("/proc/sys/net/ipv4/tcp_available_congestion_control") as f:
        return set(f.read().split())


@AS_ROOT
def test_a_tcp_socket_is_switched_to_the_link_controller_and_says_so():
    if LINK_CONGESTION_CONTROL not in _available():
        pytest.skip(f"{LINK_CONGESTION_CONTROL} is not available in this kernel")
    with socket.socket() as sock:
        assert use_congestion_control(sock, LINK_CONGESTION_CONTROL) == LINK_CONGESTION_CONTROL
        assert congestion_control(sock) == LINK_CONGESTION_CONTROL


def test_a_refused_controller_leaves_the_socket_on_its_default():
    with socket.socket() as sock:
        default = congestion_control(sock)
        assert default is not None
        assert use_congestion_control(sock, "no-such-controller") == default


def test_a_socket_that_is_not_tcp_is_left_alone():
    left, right = socket.socketpair()
    with left, right:
        assert congestion_control(left) is None
        assert use_congestion_control(left, LINK_CONGESTION_CONTROL) is None


@AS_ROOT
async def test_both_ends_of_a_kvtransit_connection_run_the_link_controller():
    if LINK_CONGESTION_CONTROL not in _available():
        pytest.skip(f"{LINK_CONGESTION_CONTROL} is not available in this kernel")
    accepted: asyncio.Future[FramedProtocol] = asyncio.get_running_loop().create_future()

    def factory() -> FramedProtocol:
        protocol = FramedProtocol(wire_connection(Role.DECODE, Role.MIDDLEBOX), DEFAULT_LIMITS)
        if not accepted.done():
            accepted.set_result(protocol)
        return protocol

    server = await asyncio.get_running_loop().create_server(factory, "127.0.0.1", 0)
    try:
        port = server.sockets[0].getsockname()[1]
        dialled = await open_endpoint("127.0.0.1", port, Role.MIDDLEBOX, Role.DECODE)
        theirs = await asyncio.wait_for(accepted, 5)
        assert congestion_control(dialled.transport.get_extra_info("socket")) == LINK_CONGESTION_CONTROL
        assert congestion_control(theirs.transport.get_extra_info("socket")) == LINK_CONGESTION_CONTROL
        dialled.abort()
        theirs.transport.abort()
    finally:
        server.close()
        await server.wait_closed()
