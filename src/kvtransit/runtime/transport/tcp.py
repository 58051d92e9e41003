"""TCP dial and listen: a kvtransit connection over a real socket, with errors that say which peer failed.

Every socket made here gets keepalive and TCP_USER_TIMEOUT (tcp_options.py) when its protocol is attached.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from kvtransit.runtime.transport.endpoint import Endpoint
from kvtransit.runtime.transport.protocol import (
    DEFAULT_LIMITS,
    ConnectionFactory,
    FlowLimits,
    FramedProtocol,
    wire_connection,
)
from kvtransit.wire.events import Hello, Role
from kvtransit.wire.limits import WIRE_VERSION


async def open_endpoint(host: str, port: int, our_role: Role, their_role: Role, *,
                        limits: FlowLimits = DEFAULT_LIMITS,
                        connection_factory: ConnectionFactory = wire_connection) -> Endpoint:
    """Connect to a kvtransit peer over TCP."""
    loop = asyncio.get_running_loop()
    try:
        _, protocol = await loop.create_connection(
            lambda: FramedProtocol(connection_factory(our_role, their_role), limits), host, port)
    except OSError as exc:
        raise ConnectionError(f"cannot connect to {their_role.name.lower()} at {host}:{port}: "
                              f"{exc.strerror or exc}") from exc
    return Endpoint(protocol)


async def listen(host: str, port: int, protocol_factory: Callable[[], FramedProtocol],
                 their_role: Role) -> tuple[asyncio.AbstractServer, str, int]:
    """Listen on host:port (port 0: any free port). Returns the listener and the address it got."""
    loop = asyncio.get_running_loop()
    try:
        listener = await loop.create_server(protocol_factory, host, port)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot listen on {host}:{port} for {their_role.name.lower()} "
                                 f"connections: {exc.strerror or exc}") from exc
    sockname = listener.sockets[0].getsockname()
    return listener, sockname[0], sockname[1]


async def open_greeted(host: str, port: int, our_role: Role, their_role: Role, *, name: str,
                       timeout_s: float | None = None, limits: FlowLimits = DEFAULT_LIMITS) -> Endpoint:
    """Connect, say Hello as `name`, and wait (up to `timeout_s`) for the peer's Hello: every kvtransit hop
    opens this way (docs/WIRE.md). A peer that answers anything else is refused with what it said."""
    endpoint = await open_endpoint(host, port, our_role, their_role, limits=limits)
    try:
        await endpoint.send(Hello(role=our_role, version=WIRE_VERSION, name=name))
        async with asyncio.timeout(timeout_s):
            first = await endpoint.next_event()
    except BaseException:
        endpoint.abort()
        raise
    if not isinstance(first, Hello):
        endpoint.abort()
        raise ConnectionError(f"the {their_role.name.lower()} at {host}:{port} did not say Hello (got {first!r})")
    return endpoint
