"""`Server`: accept connections (TCP or in memory), run one handler per connection, stop in order.

`serve` listens on TCP; `serve_memory` makes a Server reached only through `await server.connect()` over
in-memory pairs (tests, the conformance suite). Either way a failure in one handler closes that connection
only, and `shutdown` stops accepting, lets handlers finish until a deadline, then cancels the rest
(uvicorn's order), with the handlers held in one `TaskSet`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from kvtransit.runtime.tasks import TaskSet
from kvtransit.runtime.transport.endpoint import Endpoint
from kvtransit.runtime.transport.memory import memory_pipe
from kvtransit.runtime.transport.protocol import (
    DEFAULT_LIMITS,
    ConnectionFactory,
    FlowLimits,
    FramedProtocol,
    wire_connection,
)
from kvtransit.runtime.transport.tcp import listen, open_endpoint
from kvtransit.wire.errors import RemoteProtocolError
from kvtransit.wire.events import Role

log = logging.getLogger(__name__)

Handler = Callable[[Endpoint], Awaitable[None]]

# How long `shutdown` lets handlers finish on their own by default (the Server's default since it was first
# written). Agents pass their own, 1-2 s; cancelled handlers then get tasks.SHUTDOWN_DEADLINE_S to unwind.
HANDLER_GRACE_S = 5.0
# How long a finished handler's connection may take to close cleanly (flush what is queued, then FIN)
# before it is aborted: a peer that takes longer is not reading.
CLOSE_TIMEOUT_S = 1.0


class Server:
    """Accepts connections and runs `handler(endpoint)` for each, isolating failures per connection.

    A RemoteProtocolError (or any exception) in one handler sends an Error frame if it can and closes
    that connection only (counted in `connections_failed`). `shutdown(deadline_s)` stops accepting, lets
    handlers finish until the deadline, then cancels the rest (uvicorn's order).
    """

    def __init__(self, handler: Handler, our_role: Role, their_role: Role, limits: FlowLimits,
                 connection_factory: ConnectionFactory):
        self._handler = handler
        self.our_role, self.their_role = our_role, their_role
        self.limits = limits
        self._connection_factory = connection_factory
        self._listener: asyncio.AbstractServer | None = None
        self._handlers = TaskSet(f"{our_role.name.lower()} server for {their_role.name.lower()}")
        self._endpoints: set[Endpoint] = set()
        self._accepting = True
        self.host: str = "memory"
        self.port: int = 0
        self.connections_failed = 0

    async def listen(self, host: str, port: int) -> None:
        """Accept TCP connections on host:port (port 0: any free port; `host`/`port` say which)."""
        if self._listener is not None:
            raise RuntimeError(f"server already listening on {self.host}:{self.port}")
        self._listener, self.host, self.port = await listen(host, port, self._protocol_factory, self.their_role)

    @property
    def active_connections(self) -> int:
        return len(self._handlers)

    # -- accepting ------------------------------------------------------------------------------

    def _protocol_factory(self) -> FramedProtocol:
        return FramedProtocol(self._connection_factory(self.our_role, self.their_role), self.limits,
                              on_made=self._on_connection)

    def _on_connection(self, protocol: FramedProtocol) -> None:
        endpoint = Endpoint(protocol)
        if not self._accepting:
            endpoint.abort()
            return
        self._endpoints.add(endpoint)
        self._handlers.spawn(self._run(endpoint), name=f"handler {endpoint.peername}")

    async def _run(self, endpoint: Endpoint) -> None:
        failed = False
        try:
            await self._handler(endpoint)
        except RemoteProtocolError as exc:
            failed = True
            log.warning("peer %s broke the protocol: %s", endpoint.peername, exc)
            await endpoint.send_error(exc)
        except (ConnectionError, asyncio.IncompleteReadError) as exc:
            failed = True
            log.info("connection %s lost: %s", endpoint.peername, exc)
        except asyncio.CancelledError:
            failed = True
            raise
        except Exception as exc:
            failed = True
            log.exception("handler for %s failed", endpoint.peername)
            await endpoint.send_error(exc)
        finally:
            if failed:
                self.connections_failed += 1
            endpoint.close()
            self._endpoints.discard(endpoint)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(CLOSE_TIMEOUT_S):
                    await endpoint.wait_closed()
            if not endpoint.is_closed:
                endpoint.abort()

    # -- a client of this server ----------------------------------------------------------------

    async def connect(self, our_role: Role | None = None, their_role: Role | None = None, *,
                      limits: FlowLimits | None = None) -> Endpoint:
        """A client endpoint connected to this server (TCP to its own address, or in memory)."""
        our_role = self.their_role if our_role is None else our_role
        their_role = self.our_role if their_role is None else their_role
        limits = self.limits if limits is None else limits
        if self._listener is not None:
            return await open_endpoint(self.host, self.port, our_role, their_role, limits=limits,
                                       connection_factory=self._connection_factory)
        if not self._accepting:
            raise ConnectionRefusedError("memory server is shut down")
        client = FramedProtocol(self._connection_factory(our_role, their_role), limits)
        memory_pipe(client, self._protocol_factory())
        return Endpoint(client)

    # -- stopping -------------------------------------------------------------------------------

    async def shutdown(self, deadline_s: float = HANDLER_GRACE_S) -> None:
        """Stop accepting; wait up to `deadline_s` for handlers to finish; cancel the rest."""
        self._accepting = False
        if self._listener is not None:
            self._listener.close()
        cancelled = await self._handlers.close(grace_s=deadline_s)
        if cancelled:
            log.info("shutdown deadline (%.1f s) passed: cancelled %d handler(s)", deadline_s, cancelled)
        for endpoint in list(self._endpoints):
            endpoint.abort()
        if self._listener is not None:
            await self._listener.wait_closed()

    async def __aenter__(self) -> Server:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.shutdown()


async def serve(host: str, port: int, handler: Handler, our_role: Role, their_role: Role, *,
                limits: FlowLimits = DEFAULT_LIMITS,
                connection_factory: ConnectionFactory = wire_connection) -> Server:
    """Listen on host:port (port 0: any free port, see `server.port`) and run handler per connection."""
    server = Server(handler, our_role, their_role, limits, connection_factory)
    await server.listen(host, port)
    return server


def serve_memory(handler: Handler, our_role: Role, their_role: Role, *, limits: FlowLimits = DEFAULT_LIMITS,
                 connection_factory: ConnectionFactory = wire_connection) -> Server:
    """A Server reached with `await server.connect()` over in-memory pairs (tests, conformance)."""
    return Server(handler, our_role, their_role, limits, connection_factory)
