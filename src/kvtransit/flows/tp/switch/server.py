"""The switch process's sockets: one connection per rank, parts in, sums out, each port shaped as the scale-up link.

A part is held until its due time on the rank's uplink (the rank's shaper stamped it), then handed to the
`GroupReducer`; when the last part is in, the switch holds the sum's modelled time (docs/reference.md §5 module
arithmetic at 0.50 op/B, `flows/tp/model.py: switch_sum_s`) from the last part's due time, then sends the sum
down every port (each port its own shaper). A connection from an unknown group is refused with an ABORT; a
part for an unknown step, a rank's ABORT, or a rank that leaves mid-run fails the collective for every rank,
with a reason naming the rank, the step and the all-reduce.

Every sum merges one stream from each rank: `switch_merged_streams_total` (runtime/metrics.py) and `/stats` count
them, and `stats()` judges the placement test (docs/reference.md §8, `model/judge/five_tests.py: placement_test`) from
the streams the switch measured merging per sum against those the kernel declared.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from kvtransit.flows.tp.metrics import SwitchMetrics
from kvtransit.flows.tp.model import switch_sum_s
from kvtransit.flows.tp.switch.reducer import GroupReducer, Reduction, Rejected
from kvtransit.model.catalog.links import Link
from kvtransit.model.judge.five_tests import placement_test
from kvtransit.model.module.budget import KernelDeclaration, Module
from kvtransit.runtime.clock import Clock
from kvtransit.runtime.group_link.channel import Channel, PeerGone, PeerSilent
from kvtransit.wire.group import Frame, Kind, abort

# How the placement test's streams were measured here (the report's words, as the hand-off's are in five_tests.py).
SWITCH_STREAMS_MEASURED_AS = "ingress streams the switch merged per sum"


class SwitchServer:
    def __init__(self, clock: Clock, *, group: int, size: int, rate_Bps: float, latency_s: float,
                 module: Module = Module(), scale: float = 1.0, deadline_s: float = 60.0, collectives: int = 0,
                 declaration: KernelDeclaration | None = None, metrics: SwitchMetrics | None = None,
                 idle_s: float = 0.0):
        """`rate_Bps`, `latency_s` and `module.added_latency_s`: already scaled and stretched by the dilation.
        `declaration`: the kernel the sum runs as (checked by kernel_check.py; None: the stream sum's own).
        `idle_s`: how long a rank may say nothing between collectives (a serving group idles with its decode;
        0: `deadline_s`, as a fixed run of steps has it); inside a collective the deadline is `deadline_s`."""
        self.clock = clock
        self.reducer = GroupReducer(group, size, module, scale, collectives, declaration)
        self.metrics = metrics
        self.port_link = Link("switch-port", rate_Bps, latency_s, 0.0)
        self.rate_Bps, self.latency_s, self.deadline_s = rate_Bps, latency_s, deadline_s
        self.idle_s = idle_s or deadline_s
        self.channels: dict[int, Channel] = {}
        self.finished: set[int] = set()
        self.failure = ""
        self.rejected: list[str] = []
        self.done = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    async def start(self, host: str, port: int) -> int:
        self._server = await asyncio.start_server(self._accept, host, port)
        return int(self._server.sockets[0].getsockname()[1])

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        channel = Channel(reader, writer, self.clock, rate_Bps=self.rate_Bps, latency_s=self.latency_s,
                          peer="a rank")
        try:
            await self._serve(channel)
        finally:
            self._handlers.discard(task)
            await channel.close()

    async def _serve(self, channel: Channel) -> None:
        try:
            join = await channel.receive(self.deadline_s, "a JOIN")
        except PeerGone:
            return
        try:
            if join.kind is not Kind.JOIN:
                raise Rejected(f"expected a JOIN first, got {join.kind.name}")
            self.reducer.check_group(join.group)
            if join.chunk != self.reducer.size or not 0 <= join.rank < self.reducer.size \
                    or join.rank in self.channels:
                raise Rejected(f"rank {join.rank} of a group of {join.chunk} cannot join group {join.group} "
                               f"of {self.reducer.size}" + (" twice" if join.rank in self.channels else ""))
        except Rejected as exc:
            self.rejected.append(str(exc))
            await channel.send_quietly(abort(join.group, f"switch: {exc}", rank=join.rank))
            return
        rank = join.rank
        channel.peer = f"rank {rank}"
        self.channels[rank] = channel
        while not self.failure:
            try:
                frame = await self._next_frame(channel, rank)
            except PeerGone:
                if rank not in self.finished:
                    await self._fail(f"rank {rank} left group {self.reducer.group} at {self.reducer.where_next()} "
                                     "(its connection to the switch closed)", rank)
                return
            if frame.kind is Kind.BYE:
                self.finished.add(rank)
                if len(self.finished) == self.reducer.size:
                    self.done.set()
                return
            if frame.kind is Kind.ABORT:
                await self._fail(frame.reason, rank)
                return
            if frame.kind is not Kind.PART:
                await self._fail(f"switch: rank {rank} sent {frame.kind.name} at {self.reducer.where_next()}", None)
                return
            await channel.hold_until_due(frame)
            try:
                reduction = self.reducer.accept(frame.group, rank, frame.step, frame.layer, frame.payload,
                                                frame.due_ns)
            except Rejected as exc:
                self.rejected.append(str(exc))
                await self._fail(f"switch rejected a part: {exc}", None)
                return
            if reduction is not None:
                if self.metrics is not None:
                    self.metrics.merged_streams.inc(self.reducer.size)
                await self._send_sum(reduction)

    async def _next_frame(self, channel: Channel, rank: int) -> Frame:
        """The rank's next frame: within `deadline_s` while a collective is in progress, else within `idle_s`
        of silence (checked a deadline at a time, since a collective may open while this rank is silent)."""
        silent_s = 0.0
        while True:
            try:
                return await channel.receive(self.deadline_s, f"rank {rank}'s next part")
            except PeerSilent:
                silent_s += self.deadline_s
                if self.reducer.in_progress is not None or silent_s >= self.idle_s:
                    raise

    async def _send_sum(self, reduction: Reduction) -> None:
        per_stream = reduction.total.nbytes
        hold_s = switch_sum_s(per_stream, self.port_link, self.reducer.module)
        summed_ns = reduction.last_due_ns + round(hold_s * 1e9)
        await self.clock.sleep_until(summed_ns)
        payload = reduction.total.tobytes()
        for rank, channel in sorted(self.channels.items()):
            try:
                await channel.send(Frame(Kind.SUM, self.reducer.group, reduction.step, reduction.collective, rank,
                                         payload=payload), at_ns=summed_ns)
            except PeerGone:
                where = self.reducer.describe(reduction.step, reduction.collective)
                await self._fail(f"rank {rank} left group {self.reducer.group} at {where} "
                                 "(the switch could not send it the sum)", rank)
                return

    async def _fail(self, reason: str, origin: int | None) -> None:
        if self.failure:
            return
        self.failure = reason
        for rank, channel in sorted(self.channels.items()):
            if rank != origin:
                await channel.send_quietly(abort(self.reducer.group, reason, rank=rank))
        self.done.set()

    def stats(self) -> dict[str, Any]:
        r = self.reducer
        decl = r.declaration
        assert decl is not None  # GroupReducer sets the stream sum's own when none was declared
        per_sum = r.streams_merged / r.sums if r.sums else None
        return {"group": r.group, "ranks": r.size, "sums": r.sums, "input_bytes": r.input_bytes,
                "energy_j": r.energy_j, "budget": r.budget.describe(), "budget_verdict": r.budget.verdict.value,
                "kernel": decl.name, "placement": decl.placement, "streams_declared": decl.streams,
                "ingress_streams": len(self.channels), "streams_merged": r.streams_merged,
                "streams_per_sum": per_sum,
                "placement_test": placement_test(decl, per_sum, measured_as=SWITCH_STREAMS_MEASURED_AS).as_dict(),
                "failure": self.failure, "rejected": self.rejected}

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._handlers):
            task.cancel()
        for task in list(self._handlers):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._server is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):
                    await self._server.wait_closed()
