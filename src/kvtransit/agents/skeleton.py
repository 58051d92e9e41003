"""The one lifecycle of every serving process, and the parts that plug into it.

A serving process (prefill, decode, the middlebox, the KV pool, the load generator, the front end, the switch) is
an `Agent`: its own sockets and loops, plus `Part`s, the optional pieces plugged into it: a flow's (the tier's
prefix cache in the prefill, a TP group's leader in the decode, selection's relay in the middlebox; made by the
flow's `components.py`, kvtransit/flows/__init__.py) and the core's own optional ones (the real model reading the
KV). An absent piece is no part at all, never a `None` to check: every hook a role asks of its parts has a default
that does nothing (uvicorn's lifespan "off" is such a null object).

`serve(agent, stop)` is the lifecycle, the same for every role (uvicorn's Server.serve → startup → main loop →
shutdown):

1. /metrics and /stats first (the stats merge the agent's and every part's), then the agent's own `start` (its
   listening sockets and dials), then each part's `start`, in order. Whatever a start opens goes through the
   `AgentContext`, which records each port for the readiness line and each teardown on one exit stack;
2. the one readiness line, with every port (agents/process.py: `announce_ready`);
3. the agent's main loops run until `stop` is set or one of them fails (a main loop only ends by failing: its
   exception is the process's);
4. `agent.stopping()`, then everything unwinds in reverse order of start, whatever happened.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any, Protocol

from prometheus_client import CollectorRegistry

from kvtransit.agents.process import Address, announce_ready, listen, port_in_use_error, start_http
from kvtransit.runtime.http import HttpServer
from kvtransit.runtime.tasks import TaskSet
from kvtransit.runtime.transport import Server
from kvtransit.wire.events import Role


class AgentContext:
    """What an agent and its parts start with: listening (each port recorded for the readiness line), tasks, and
    one exit stack that closes everything they opened, in reverse order."""

    def __init__(self, stack: contextlib.AsyncExitStack, owner: str, http: HttpServer):
        self._stack = stack
        self.http = http  # the /metrics and /stats server: a part may add a route of its own
        self.ports: dict[str, int | str] = {"metrics_port": http.port}
        self.tasks = TaskSet(owner)
        stack.push_async_callback(self.tasks.close)

    async def listen(self, address: Address, flag: str, handler, our_role: Role, their_role: Role, *,
                     port_key: str, grace_s: float = 1.0) -> Server:
        """A wire server on `address` (a port in use is a one-line error naming `flag`), its port announced as
        `port_key`, shut down (its handlers given `grace_s`) when the agent stops."""
        server = await listen(address, flag, handler, our_role, their_role)
        self.ports[port_key] = server.port
        self._stack.push_async_callback(server.shutdown, grace_s)
        return server

    async def listen_streams(self, address: Address, flag: str,
                             handler: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]], *,
                             port_key: str) -> int:
        """A plain asyncio stream server (the group links' frames, not the KV wire's), announced as `port_key`."""
        try:
            server = await asyncio.start_server(handler, address.host, address.port)
        except OSError as exc:
            raise port_in_use_error(address, flag, exc) from None

        async def close() -> None:
            server.close()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await server.wait_closed()

        self._stack.push_async_callback(close)
        port = int(server.sockets[0].getsockname()[1])
        self.ports[port_key] = port
        return port

    async def serve_http(self, server: HttpServer, address: Address, flag: str, *, port_key: str) -> None:
        """Another HTTP server of the agent's (the middlebox's control API), announced as `port_key`."""
        try:
            await server.start(address.host, address.port)
        except OSError as exc:
            raise port_in_use_error(address, flag, exc) from None
        self._stack.push_async_callback(server.close)
        self.ports[port_key] = server.port

    def announce(self, **fields: int | str) -> None:
        """More fields of the readiness line (a setting the launcher learns from the agent: its link back-end)."""
        self.ports.update(fields)

    def on_close(self, callback: Callable[[], Awaitable[Any]]) -> None:
        """Call `callback` when the agent stops (in reverse order of registration)."""
        self._stack.push_async_callback(callback)

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """A background task of the agent's, cancelled when it stops (its failure is logged, not fatal)."""
        return self.tasks.spawn(coro, name)


class Part:
    """An optional piece of an agent. Every role asks its parts through hooks whose defaults do nothing (each role
    has a subclass listing its own: agents/prefill/parts.py, agents/decode/parts.py); a part overrides the ones it
    answers."""

    name: str = ""

    async def start(self, ctx: AgentContext) -> None:
        """Bind, dial, spawn (through `ctx`, so each is announced and torn down); before the readiness line."""

    def stats(self) -> Mapping[str, Any]:
        """Its keys of the agent's /stats."""
        return {}

    async def settled(self) -> None:
        """Return once work it began that its stats count only when it ends (a background write-back) has ended,
        or a short while has passed: /stats waits for it, so a report never counts one side of a transfer that
        the other side already counted."""

    async def close(self) -> None:
        """Release what it holds beyond `ctx`'s (called in reverse order of start)."""


class Agent(Protocol):
    role: str
    name: str
    registry: CollectorRegistry
    metrics_listen: Address

    @property
    def parts(self) -> Sequence[Part]: ...

    async def start(self, ctx: AgentContext) -> None: ...

    def main_loops(self) -> Mapping[str, Coroutine[Any, Any, Any]]: ...

    def stats(self) -> dict[str, Any]: ...

    async def stopping(self) -> None: ...


async def merged_stats(agent: Agent) -> dict[str, Any]:
    """The agent's /stats: its own keys, then each part's, once the parts have settled (Part.settled)."""
    for part in agent.parts:
        await part.settled()
    stats = agent.stats()
    for part in agent.parts:
        stats.update(part.stats())
    return stats


async def serve(agent: Agent, stop: asyncio.Event) -> None:
    """Run `agent` from start to stop (the module docstring's four steps)."""
    async with contextlib.AsyncExitStack() as stack:
        http = await start_http(agent.metrics_listen, agent.registry, lambda: merged_stats(agent))
        stack.push_async_callback(http.close)
        ctx = AgentContext(stack, agent.name, http)
        await agent.start(ctx)
        for part in agent.parts:
            await part.start(ctx)
            stack.push_async_callback(part.close)
        announce_ready(agent.role, agent.name, **ctx.ports)
        loops = TaskSet(agent.role)
        stack.push_async_callback(loops.close)
        mains = [loops.spawn(coro, name) for name, coro in agent.main_loops().items()]
        stopper = loops.spawn(stop.wait(), "stop")
        try:
            done, _ = await asyncio.wait([*mains, stopper], return_when=asyncio.FIRST_COMPLETED)
            for task in mains:  # a main loop only ends by failing; the stop task ends cleanly
                if task in done and not task.cancelled() and (failure := task.exception()) is not None:
                    raise failure
        finally:
            await agent.stopping()
