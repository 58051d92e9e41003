"""The middlebox's decode side: one connection per decode instance, dialled, read, and dialled again.

Decode may start after us (compose) or restart: the first dial retries for `DEFAULT_CONNECT_TIMEOUT_S`, and a
connection that drops is dialled again for as long as we run, so a restarted decode is picked up. Each
connection carries the fault chain in its write path (faults/). Hand-offs are sent to the connected instance
with the fewest not yet acked; each one is `unacked` on its peer until decode's Ack (or Error) comes back.

What decode says is handed to the owner (app.py) through two callbacks: `on_ack(ack, handoff)` for an Ack
(`handoff` None when it is not one we are waiting for), `on_lost(handoff, reason)` for a hand-off decode
refused with an Error or lost with its connection (the prefill still holds the KV and may send it again).

Each connection is the hand-off link itself: its socket runs TCP CUBIC, as every kvtransit socket does, which
leaves the pacing to the link's shaper (runtime/transport/tcp_options.py: LINK_CONGESTION_CONTROL says why); a host
that refuses it is logged here and shown in /stats (`link.tcp_congestion_control`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from kvtransit.agents.middlebox.faults import FaultChain, FaultedEndpoint
from kvtransit.agents.middlebox.handoff import Handoff
from kvtransit.model.errors import ConfigError
from kvtransit.model.serving.policies import least_loaded
from kvtransit.runtime.redial import dial_within
from kvtransit.runtime.tasks import TaskSet
from kvtransit.runtime.transport import Endpoint, open_greeted
from kvtransit.runtime.transport.tcp_options import LINK_CONGESTION_CONTROL, congestion_control
from kvtransit.wire.errors import ProtocolError
from kvtransit.wire.events import Ack, Bye, Error, Role

log = logging.getLogger(__name__)

# Decode may start after us (compose) or restart: keep trying to connect for this long at start-up.
DEFAULT_CONNECT_TIMEOUT_S = 30.0
# Between dials: a starting process binds its port within a few hundred ms; 0.2 s finds it soon after.
CONNECT_RETRY_S = 0.2

OnAck = Callable[[Ack, "Handoff | None"], Awaitable[None]]
OnLost = Callable[[Handoff, str], Awaitable[None]]


@dataclass
class DecodePeer:
    name: str
    host: str
    port: int
    endpoint: Endpoint | None = None
    unacked: dict[int, Handoff] = field(default_factory=dict)
    congestion_control: str | None = None  # what the link's TCP socket runs (LINK_CONGESTION_CONTROL if allowed)

    @property
    def connected(self) -> bool:
        return self.endpoint is not None and not self.endpoint.is_closing


class DecodePeers:
    """The decode instances one middlebox forwards to (see the module docstring)."""

    def __init__(self, addresses: list[tuple[str, int]], *, name: str, faults: FaultChain, on_ack: OnAck,
                 on_lost: OnLost):
        """`name`: ours, said in Hello."""
        self.peers = [DecodePeer(f"decode-{i}", host, port) for i, (host, port) in enumerate(addresses)]
        self.name = name
        self.faults = faults
        self._on_ack = on_ack
        self._on_lost = on_lost
        self._tasks = TaskSet(f"{name} decode peers")
        self._closing = False

    async def connect_all(self, timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S) -> None:
        """Connect to every decode instance, retrying while they start; a clear error after `timeout_s`."""
        await asyncio.gather(*(self._connect(peer, timeout_s) for peer in self.peers))

    def pick(self) -> DecodePeer | None:
        """The connected decode instance with the fewest hand-offs not yet acked (docs/reference.md §4's router sees
        queue + running; the middlebox sees what it has sent and decode has not yet taken)."""
        live = [p for p in self.peers if p.connected]
        return live[least_loaded([len(p.unacked) for p in live])] if live else None  # the twin's rule too

    def forget(self, handoff: Handoff) -> None:
        """The hand-off ended here (it failed): no peer waits for its Ack any more."""
        for peer in self.peers:
            if peer.unacked.get(handoff.request_id) is handoff:
                del peer.unacked[handoff.request_id]

    async def close(self) -> None:
        self._closing = True
        for peer in self.peers:
            endpoint = peer.endpoint
            if endpoint is not None and not endpoint.is_closing:
                await endpoint.goodbye("middlebox stopping")
                endpoint.close()
        await self._tasks.close()

    # -- one connection ---------------------------------------------------------------------------------

    async def _connect(self, peer: DecodePeer, timeout_s: float) -> None:
        def greet() -> Awaitable[Endpoint]:
            # Decode says Hello as it accepts: one that has not within the dial's own timeout is not a decode.
            return open_greeted(peer.host, peer.port, Role.MIDDLEBOX, Role.DECODE, name=self.name,
                                timeout_s=timeout_s)

        def give_up(exc: BaseException) -> Exception:
            return ConfigError(f"cannot reach {peer.name} at {peer.host}:{peer.port} (--decode) after "
                               f"{timeout_s:.0f} s: {exc}")

        # Refused, unreachable, or no Hello in time (TimeoutError is an OSError): retried until `timeout_s`.
        greeted = await dial_within(greet, within_s=timeout_s, retry_s=CONNECT_RETRY_S, retry_on=OSError,
                                    give_up=give_up)
        peer.congestion_control = congestion_control(greeted.transport.get_extra_info("socket"))
        if peer.congestion_control not in (None, LINK_CONGESTION_CONTROL):
            log.warning("the link to %s runs TCP %s: this host refused %s (the hand-off may lag the model after "
                        "idle gaps)", peer.name, peer.congestion_control, LINK_CONGESTION_CONTROL)
        # The faults sit in the write path of everything after the greeting (the hand-offs and their Errors).
        endpoint = FaultedEndpoint(greeted, self.faults)
        peer.endpoint = endpoint
        self._tasks.spawn(self._read(peer), f"read {peer.name}")

    async def _redial(self, peer: DecodePeer) -> None:
        """A decode connection dropped (decode restarted, the link reset): dial it again while we run."""
        while not self._closing:
            try:
                await self._connect(peer, timeout_s=DEFAULT_CONNECT_TIMEOUT_S)
                log.warning("%s is connected again", peer.name)
                return
            except (ConfigError, ConnectionError, OSError, ProtocolError) as exc:
                log.info("%s not reachable yet: %s", peer.name, exc)
                await asyncio.sleep(CONNECT_RETRY_S)

    async def _read(self, peer: DecodePeer) -> None:
        endpoint = peer.endpoint
        assert endpoint is not None
        reason = f"{peer.name} closed the connection"
        try:
            async for event in endpoint:
                match event:
                    case Ack():
                        await self._on_ack(event, peer.unacked.pop(event.request_id, None))
                    case Error():
                        log.warning("%s reports: %s (request %s)", peer.name, event.message, event.request_id)
                        if event.request_id is not None and event.request_id in peer.unacked:
                            handoff = peer.unacked.pop(event.request_id)
                            await self._on_lost(handoff, f"{peer.name}: {event.message}")
                    case Bye():
                        break
        except (ProtocolError, ConnectionError) as exc:
            reason = f"{peer.name} connection lost: {exc}"
            log.warning(reason)
        finally:
            endpoint.abort()
            # Everything sent there and not yet acked is lost with the connection: say so, per request (its
            # prefill still holds the KV and sends it again).
            for handoff in list(peer.unacked.values()):
                await self._on_lost(handoff, reason)
            peer.unacked.clear()
            if not self._closing:
                self._tasks.spawn(self._redial(peer), f"redial {peer.name}")
