"""One rank of a TP group: each step holds its shard's modelled compute on the clock, then all-reduces real
bytes, ring or switch, and checks every sum it gets back against the exact sum (payloads.py).

EP's all-to-all (ring only): the dispatch's n − 1 hops carry BF16, or with `dispatch="fp8"` what the fp8 kernel
(kernels/registry.py: Fp8Codec, E4M3 with a scale per 64 values) makes of them, cast at the sending GPU and back
at the receiving one; the combine's n − 1 hops stay BF16 (flows/tp/moe_dispatch.py).

Ring (reduce-scatter then all-gather, docs/reference.md §7): the payload is cut into n chunks; in n − 1 hops each rank
sends a chunk to the next rank and adds the one it receives from the previous (stream_sum, BF16), then in n − 1
more hops the reduced chunks go round. Switch: every rank sends its whole part up and gets the sum back.

A failure anywhere fails the step for every rank, with one reason naming the rank, the step and the collective
(layer): the rank that finds it (a peer's EOF, a deadline, a wrong sum) sends an ABORT with the reason onwards
(ring: to the next rank, which forwards it; switch: the switch tells every rank), and a rank that gets an ABORT
fails with that reason. Nothing waits past `deadline_s` (PeerGone).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from kvtransit.flows.tp.moe_dispatch import DISPATCH_BF16, DISPATCH_FP8, DISPATCH_VALUE_BYTES, E4M3_HALF_ULP
from kvtransit.flows.tp.rank.payloads import BF16, CYCLE, Payloads
from kvtransit.kernels.registry import Fp8Codec
from kvtransit.kernels.stream_sum import sum_streams
from kvtransit.runtime.clock import Clock
from kvtransit.runtime.group_link.channel import Channel
from kvtransit.wire.group import Frame, Kind, abort

MODE_RING = "ring"
# An all-to-all hop's `chunk` field: after the all-reduce's 2(n − 1) hops (n ≤ 64), so the two never mix.
ALLTOALL_HOP_BASE = 1000
MODE_SWITCH = "switch"


@dataclass(frozen=True)
class RankPlan:
    """What a rank does, every duration already stretched by the dilation and every rate scaled."""

    group: int
    rank: int
    size: int
    mode: str  # ring | switch
    steps: int
    collectives: int  # real all-reduces a step: 2·L per layer, or 1 a step (per-step granularity)
    values: int  # BF16 values in one real all-reduce (a multiple of `size`)
    compute_s: float  # the shard's roofline step, held on the clock
    held_s: float  # per-step granularity: the other all-reduces' latency terms, held on the clock
    deadline_s: float = 10.0  # the longest wait for a peer before the step fails
    per_layer: int = 2  # all-reduces a layer: 2 (TP), 1 (EP: the attention's; the MLP's is the all-to-all)
    alltoall_values: int = 0  # EP (ring only): BF16 values a hop of the dispatch + combine carries; 0: none
    dispatch: str = DISPATCH_BF16  # what the dispatch's hops carry: bf16, or fp8 (the kernel, run at the GPU)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class StepTiming:
    step_s: float
    compute_s: float
    collective_s: float


@dataclass
class RankResult:
    rank: int
    ok: bool = True
    reason: str = ""
    steps: list[StepTiming] = field(default_factory=list)
    sums_checked: int = 0
    late_s: float = 0.0  # Σ frames' arrival after their due time: what the host added to the model

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "ok": self.ok, "reason": self.reason, "sums_checked": self.sums_checked,
                "late_s": self.late_s,
                "steps": [{"step_s": s.step_s, "compute_s": s.compute_s, "collective_s": s.collective_s}
                          for s in self.steps]}


class PartSource(Protocol):
    """Where a rank's parts come from (payloads.py's Payloads, or a serving group's view of one at a step's size)."""

    def part(self, rank: int, step: int, collective: int) -> np.ndarray: ...
    def phase(self, rank: int, step: int, collective: int) -> int: ...


class CollectiveFailed(Exception):
    """The step failed; the message is the one reason every rank reports."""


def _where(plan: RankPlan, step: int, collective: int) -> str:
    """`step s, layer l (all-reduce j)`: two all-reduces a layer (docs/reference.md §7); per-step granularity has
    one."""
    if plan.collectives == 1:
        return f"step {step}, every layer (one all-reduce a step)"
    return f"step {step}, layer {collective // plan.per_layer} (all-reduce {collective})"


class _Ring:
    def __init__(self, plan: RankPlan, prev: Channel, nxt: Channel):
        self.plan, self.prev, self.next = plan, prev, nxt
        self.prev_rank = (plan.rank - 1) % plan.size
        if plan.dispatch not in DISPATCH_VALUE_BYTES:
            raise ValueError(f"unknown dispatch {plan.dispatch!r} (one of {', '.join(DISPATCH_VALUE_BYTES)})")
        self._fp8 = Fp8Codec() if plan.dispatch == DISPATCH_FP8 else None
        self._fp8_header_bytes = 0
        # A dispatch chunk's fp8 bytes by its payload phase. The parts repeat every CYCLE phases (payloads.py), so
        # `prepare` runs the kernel once on each distinct chunk before the first step: the host's numpy time is not
        # the GPU's cast (the model holds that, with the compute), and run on every hop it would land on the
        # modelled link instead.
        self._fp8_wire: dict[int, bytes] = {}

    def prepare(self, parts: Payloads) -> None:
        """Every distinct dispatch chunk through the fp8 kernel, and back: each must decode within FP8's rounding
        (a kernel that does not is a failed step, not a silent error)."""
        if self._fp8 is None:
            return
        for phase in range(CYCLE):
            part = parts.at_phase(phase)
            encoded = self._fp8.encode(part.reshape(1, -1))  # a [tokens, d] view, as the kernel takes activations
            self._fp8_header_bytes = len(encoded.header)
            wire = self._fp8_wire[phase] = encoded.header + encoded.payload.tobytes()
            sent, got = part.astype(np.float32), self._cast_back(wire).astype(np.float32)
            # The payloads' values, scaled by their block's amax / 448, are all E4M3 normals.
            if not np.all(np.abs(got - sent) <= E4M3_HALF_ULP * np.abs(sent)):
                raise CollectiveFailed(f"rank {self.plan.rank}: the fp8 kernel decodes dispatch chunk {phase} "
                                       "outside FP8's rounding")

    def _on_wire(self, parts: PartSource, rank: int, step: int, collective: int, dispatch_hop: bool) -> bytes:
        """A chunk as a hop carries it: a dispatch hop's through the fp8 kernel (header, codes, scales)."""
        if self._fp8 is None or not dispatch_hop:
            return parts.part(rank, step, collective).tobytes()
        return self._fp8_wire[parts.phase(rank, step, collective)]

    def _cast_back(self, wire: bytes | bytearray | memoryview) -> np.ndarray:
        """The receiving GPU's half of the fp8 kernel: a dispatched chunk back to BF16."""
        assert self._fp8 is not None  # only dispatch hops of an fp8 dispatch come here
        h = self._fp8_header_bytes
        return self._fp8.decode(bytes(wire[:h]), np.frombuffer(wire, np.uint8, offset=h)).reshape(-1).astype(BF16)

    async def allreduce(self, part: np.ndarray, step: int, collective: int, at_ns: int) -> tuple[np.ndarray, int]:
        n, me = self.plan.size, self.plan.rank
        buf = part.copy().reshape(n, -1)
        for hop in range(2 * (n - 1)):
            gather = hop >= n - 1
            s = hop - (n - 1) if gather else hop
            send_idx = (me + 1 - s) % n if gather else (me - s) % n
            recv_idx = (me - s) % n if gather else (me - s - 1) % n
            await self.next.send(Frame(Kind.PART, self.plan.group, step, collective, me, hop,
                                       payload=buf[send_idx].tobytes()), at_ns=at_ns)
            frame = await self._receive(step, collective, hop, buf[recv_idx].nbytes)
            await self.prev.hold_until_due(frame)
            at_ns = max(at_ns, frame.due_ns)  # the next hop leaves, in model time, when this one arrived
            got = np.frombuffer(frame.payload, dtype=BF16)
            buf[recv_idx] = got if gather else sum_streams([buf[recv_idx], got])
        return buf.reshape(-1), at_ns

    async def alltoall(self, parts: PartSource, step: int, collective: int, at_ns: int) -> int:
        """The MoE dispatch + combine of one layer (docs/reference.md §7) as 2(n − 1) ring hops of 1/n of the tokens'
        activations each: the model's bytes (2·t·k·d·(n − 1)/n values a rank) and its 2(n − 1) latencies. Each
        chunk received is checked against what its sender's part is (a lost or mixed-up chunk is found)."""
        n, me = self.plan.size, self.plan.rank
        for hop in range(2 * (n - 1)):
            dispatch = hop < n - 1  # the first n − 1 hops dispatch, the rest combine
            await self.next.send(Frame(Kind.PART, self.plan.group, step, collective, me, ALLTOALL_HOP_BASE + hop,
                                       payload=self._on_wire(parts, me, step, collective + hop, dispatch)),
                                 at_ns=at_ns)
            expected = self._on_wire(parts, self.prev_rank, step, collective + hop, dispatch)
            frame = await self._receive(step, collective, ALLTOALL_HOP_BASE + hop, len(expected))
            await self.prev.hold_until_due(frame)
            at_ns = max(at_ns, frame.due_ns)
            if frame.payload != expected:
                raise CollectiveFailed(f"rank {me} found a wrong all-to-all chunk from rank {self.prev_rank} at "
                                       f"{_where(self.plan, step, collective)}, hop {hop}")
            # An fp8 chunk equal to the bytes `prepare` checked decodes as they did: within FP8's rounding.
        return at_ns

    async def _receive(self, step: int, collective: int, hop: int, nbytes: int) -> Frame:
        where = _where(self.plan, step, collective)
        frame = await _receive_or_fail(self.prev, self.plan, f"rank {self.prev_rank}'s part at {where}")
        expected = (Kind.PART, self.plan.group, step, collective, self.prev_rank, hop)
        got = (frame.kind, frame.group, frame.step, frame.layer, frame.rank, frame.chunk)
        if got != expected or len(frame.payload) != nbytes:
            raise CollectiveFailed(f"rank {self.plan.rank}: at {where} expected part {expected[1:]} from rank "
                                   f"{self.prev_rank}, got {frame.kind.name} {got[1:]} of {len(frame.payload)} B")
        return frame

    async def fail(self, reason: str) -> None:
        await self.next.send_quietly(abort(self.plan.group, reason, rank=self.plan.rank))

    @property
    def channels(self) -> list[Channel]:
        return [self.prev, self.next]


async def _receive_or_fail(channel: Channel, plan: RankPlan, what: str) -> Frame:
    """The next frame within the plan's deadline; a peer gone, a deadline missed or an ABORT fails the step."""
    return await channel.receive_or_fail(plan.deadline_s, what, CollectiveFailed, f"rank {plan.rank}")


class _Switch:
    def __init__(self, plan: RankPlan, switch: Channel):
        self.plan, self.switch = plan, switch

    async def allreduce(self, part: np.ndarray, step: int, collective: int, at_ns: int) -> tuple[np.ndarray, int]:
        where = _where(self.plan, step, collective)
        await self.switch.send(Frame(Kind.PART, self.plan.group, step, collective, self.plan.rank,
                                     payload=part.tobytes()), at_ns=at_ns)
        frame = await _receive_or_fail(self.switch, self.plan, f"the sum of {where}")
        if (frame.kind, frame.step, frame.layer) != (Kind.SUM, step, collective) \
                or len(frame.payload) != part.nbytes:
            raise CollectiveFailed(f"rank {self.plan.rank}: at {where} expected its sum, got {frame.kind.name} "
                                   f"step {frame.step} all-reduce {frame.layer} of {len(frame.payload)} B")
        await self.switch.hold_until_due(frame)
        return np.frombuffer(frame.payload, dtype=BF16), max(at_ns, frame.due_ns)

    async def fail(self, reason: str) -> None:
        await self.switch.send_quietly(abort(self.plan.group, reason, rank=self.plan.rank))

    @property
    def channels(self) -> list[Channel]:
        return [self.switch]


async def run_steps(plan: RankPlan, clock: Clock, algorithm: _Ring | _Switch, start_ns: int) -> RankResult:
    """The step loop: hold compute, then `plan.collectives` real all-reduces (+ the held latency), check sums."""
    payloads = Payloads(plan.values, plan.size)
    moe = Payloads(plan.alltoall_values, plan.size) if plan.alltoall_values else None
    if moe is not None and not isinstance(algorithm, _Ring):
        raise ValueError("an all-to-all runs between ranks: give EP a ring")
    result = RankResult(plan.rank)
    if moe is not None:
        assert isinstance(algorithm, _Ring)
        try:
            algorithm.prepare(moe)
        except CollectiveFailed as exc:
            result.ok, result.reason = False, str(exc)
            await algorithm.fail(result.reason)
            return result
    await clock.sleep_until(start_ns)
    step = collective = 0
    # Model time runs on absolute deadlines (ARCHITECTURE.md, time and scale, as DeadlineSchedule holds steps): a step
    # starts when the last one was due to end, its collectives when its compute was due to end, and each hop leaves when
    # the one before it was due to arrive; a late wake-up is then not carried into every later hold. What is measured is
    # real: the time between consecutive step ends, so a host that falls behind shows.
    model_ns = real_ns = start_ns
    try:
        for step in range(plan.steps):
            at_ns = model_ns + round(plan.compute_s * 1e9)
            await clock.sleep_until(at_ns)
            t1 = clock.now_ns()
            for collective in range(plan.collectives):
                total, at_ns = await algorithm.allreduce(payloads.part(plan.rank, step, collective), step,
                                                         collective, at_ns)
                if wrong := payloads.wrong_values(total, step, collective):
                    raise CollectiveFailed(f"rank {plan.rank} found a wrong sum at {_where(plan, step, collective)} "
                                           f"({wrong} of {plan.values} values differ from the exact sum)")
                result.sums_checked += 1
                if moe is not None:
                    assert isinstance(algorithm, _Ring)
                    at_ns = await algorithm.alltoall(moe, step, collective, at_ns)
            model_ns = at_ns + round(plan.held_s * 1e9)
            await clock.sleep_until(model_ns)
            t2 = clock.now_ns()
            result.steps.append(StepTiming((t2 - real_ns) / 1e9, (t1 - real_ns) / 1e9, (t2 - t1) / 1e9))
            real_ns = t2
    except CollectiveFailed as exc:
        result.ok, result.reason = False, str(exc)
        await algorithm.fail(result.reason)
    result.late_s = sum(channel.late_ns for channel in algorithm.channels) / 1e9
    if result.ok:
        for channel in algorithm.channels:
            await channel.send_quietly(Frame(Kind.BYE, plan.group, step, collective, plan.rank))
    return result


def ring(plan: RankPlan, prev: Channel, nxt: Channel) -> _Ring:
    return _Ring(plan, prev, nxt)


def switch(plan: RankPlan, channel: Channel) -> _Switch:
    return _Switch(plan, channel)


# The all-reduce a rank runs, whichever way its group sums (the two share one face: run a step, their channels).
AllReduce = _Ring | _Switch
