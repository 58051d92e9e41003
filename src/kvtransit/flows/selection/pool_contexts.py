"""The pool's remote-KV port (`--kv-placement remote`): the long contexts' page summaries and pages, for the
middlebox that relays decode's legs (flows/selection/middlebox_relay.py).

One connection per decode the middlebox serves; each request (SUMMARIES: the named requests' summaries; FETCH: their
chosen pages, or every token) is answered at once and unstamped: the pool sits beside the middlebox, and the link
the answer crosses is stamped there. The contexts are made ahead of their requests, as a long document is in the pool
before it is asked for (flows/selection/remote_context.py: RemoteContexts.make_ahead; the first ones before the pool
says it is ready, the next after each leg), on a worker thread, so the pool's hand-off port keeps serving meanwhile;
one a leg had to wait for is counted (`made_on_demand`).
"""

from __future__ import annotations

import asyncio
import logging

from kvtransit.flows.selection.remote_context import (
    GROUP,
    IDLE_WAIT_S,
    LegError,
    RemoteContexts,
    pack_ids,
    unpack_ids,
)
from kvtransit.runtime.clock import MonotonicClock
from kvtransit.runtime.group_link.channel import Channel, PeerGone, PeerSilent
from kvtransit.wire.group import Frame, Kind, abort

log = logging.getLogger(__name__)



class RemoteContextServer:
    def __init__(self, contexts: RemoteContexts):
        self.contexts = contexts
        self.clock = MonotonicClock(spin_s=0)
        self.served = {"summaries": 0, "pages": 0}  # wire bytes at scale
        self.failures = 0
        self._ahead: asyncio.Task | None = None
        self._newest = -1

    async def prepare(self) -> None:
        """The first remote requests' contexts, before the pool is ready."""
        await asyncio.to_thread(self.contexts.make_ahead, -1)

    def _make_ahead(self, ids: list[int]) -> None:
        """After a leg: the next requests' contexts in the background (one making at a time)."""
        self._newest = max(self._newest, *ids)
        if self._ahead is None or self._ahead.done():
            self._ahead = asyncio.get_running_loop().create_task(
                asyncio.to_thread(self.contexts.make_ahead, self._newest), name="remote contexts ahead")

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        channel = Channel(reader, writer, self.clock, rate_Bps=1.0, latency_s=0.0, peer="the middlebox")
        try:
            while True:
                try:
                    frame = await channel.receive(IDLE_WAIT_S, "the middlebox's next leg")
                except PeerSilent:
                    continue
                if frame.kind in (Kind.BYE, Kind.ABORT):
                    return
                ids, rest = unpack_ids(frame.payload, frame.kind.name)
                self._make_ahead(ids)
                if frame.kind is Kind.SUMMARIES:
                    data = await asyncio.to_thread(self.contexts.summaries, ids)
                    self.served["summaries"] += len(data)
                elif frame.kind is Kind.FETCH:
                    page_ids = self.contexts.page_ids_from(rest, len(ids))
                    data = await asyncio.to_thread(self.contexts.pages, ids, page_ids)
                    self.served["pages"] += len(data)
                else:
                    raise LegError(f"unexpected {frame.kind.name} at step {frame.step}")
                await channel.send(Frame(frame.kind if frame.kind is Kind.SUMMARIES else Kind.PAGES, frame.group,
                                         frame.step, payload=pack_ids(ids) + data), shaped=False)
        except LegError as exc:
            self.failures += 1
            log.warning("remote KV: %s", exc)
            await channel.send_quietly(abort(GROUP, f"the KV pool: {exc}"))
        except PeerGone as exc:
            log.info("remote KV: %s", exc)
        finally:
            await channel.close()

    async def close(self) -> None:
        if self._ahead is not None:
            await asyncio.gather(self._ahead, return_exceptions=True)

    def stats(self, model_bytes_per_byte: float) -> dict:
        return {"served_bytes": {leg: n * model_bytes_per_byte for leg, n in self.served.items()},
                "made_on_demand": self.contexts.made_on_demand, "failures": self.failures}
