"""One rank of ring attention (Liu et al., arXiv:2310.01889; docs/reference.md §7): per layer, it computes blockwise
attention on the block it holds (the model's roofline time, held on the clock) while passing that block to the
next rank over the shaped ring link, n steps a layer, n − 1 of them a hop. A step lasts whichever is longer, the
compute or the hop (overlap), as measured: the next step starts when both its block has arrived and the compute
on the last one was due to end.

Model time runs on absolute deadlines, as a TP rank's does (flows/tp/rank/rank.py): a layer starts when the
last was due to end, a block leaves when the step starts, and a late wake-up is not carried on. What is measured
is real: each prompt's and each hop's time on this host's clock.

The blocks are real KV (blocks.py), through the link's codec at every hop. The rank holding the sample's decode
queries keeps the blocks it was given for the sample's layers and, after the timed prompts, runs blockwise
attention on them (kernels/ring_attention.py: the online softmax), giving the attention-output error of the ring
as it ran against exact attention.

A failure anywhere fails the prompt for every rank with one reason (a dead peer, a deadline, a frame out of
order): the rank that finds it sends an ABORT on to the next rank, which forwards it.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvtransit.flows.ring.blocks import BlockError, LinkCodec, RingBlocks, RingKV
from kvtransit.kernels.ring_attention import blockwise_attention, full_attention, relative_l2
from kvtransit.runtime.clock import Clock
from kvtransit.runtime.group_link.channel import Channel
from kvtransit.wire.group import Frame, Kind, abort


@dataclass(frozen=True)
class RingRankPlan:
    """What a ring attention rank does, every duration already stretched by the dilation."""

    group: int
    rank: int
    size: int
    layers: int  # the model's
    prompts: int  # prompts run one after another (the first a warm-up in the summary)
    compute_s: float  # blockwise attention of one block, held
    sample: str  # the real-KV sample's path
    text: str
    codec: str = "none"
    codec_params: dict[str, Any] = field(default_factory=dict)
    wire_dtype: str = "bfloat16"
    module_occupancy: float = 0.0  # a transit-bound module: link bytes per raw byte (charged ops / budget); 0: none
    module_latency_s: float = 0.0  # the module's added latency (0: no module)
    deadline_s: float = 10.0

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class RingRankResult:
    rank: int
    ok: bool = True
    reason: str = ""
    prompt_s: list[float] = field(default_factory=list)
    hop_s: list[float] = field(default_factory=list)  # every hop's step: due start to (arrival and compute) done
    hops: int = 0
    raw_bytes: int = 0  # Σ blocks sent, uncoded at the wire dtype
    wire_bytes: int = 0  # Σ what the codec made of them
    late_s: float = 0.0
    accuracy: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        hops = self.hop_s[len(self.hop_s) // max(1, len(self.prompt_s)):] if len(self.prompt_s) > 1 else self.hop_s
        return {"rank": self.rank, "ok": self.ok, "reason": self.reason, "prompt_s": self.prompt_s,
                "hop_median_s": statistics.median(hops) if hops else math.nan,
                "hop_mean_s": statistics.fmean(hops) if hops else math.nan,
                "hops": self.hops, "raw_bytes": self.raw_bytes, "wire_bytes": self.wire_bytes,
                "late_s": self.late_s, "accuracy": self.accuracy}


class RingFailed(Exception):
    """The prompt failed; the message is the one reason every rank reports."""


class _Kept:
    """The query rank's blocks as they reached it, for the sample's layers: block j of layer ℓ after its hops."""

    def __init__(self, kv: RingKV, rank: int):
        self.kv, self.rank = kv, rank
        self.blocks: dict[tuple[int, int], np.ndarray] = {}

    def keep(self, layer: int, source: int, block: np.ndarray) -> None:
        if layer < self.kv.sample_layers:
            self.blocks[(layer, source)] = block

    def error(self) -> dict[str, Any]:
        """The ring's attention output for the sample's queries, against exact attention (float64)."""
        s, n = self.kv.sample, self.kv.n
        assert s.q is not None and s.q_positions is not None
        layers = min(self.kv.sample_layers, 1 + max(layer for layer, _ in self.blocks))
        out = np.empty((layers, *s.q.shape[1:]), np.float64)
        for layer in range(layers):
            visits = []
            for step in range(n):
                j = (self.rank - step) % n
                block = self.kv.block(j, layer) if step == 0 else self.blocks[(layer, j)]
                visits.append((block[0, 0], block[0, 1], self.kv.bounds[j][0]))
            out[layer] = blockwise_attention(s.q[layer], s.q_positions, visits)
        exact = full_attention(s.q[:layers], s.q_positions, s.k[:layers], s.v[:layers])
        return {"out_err_ring": relative_l2(exact, out), "layers": layers, "queries": int(s.q_positions.size),
                "heads": int(s.q.shape[1]), "block_tokens": self.kv.block_tokens}


async def _receive_or_fail(channel: Channel, plan: RingRankPlan, what: str) -> Frame:
    return await channel.receive_or_fail(plan.deadline_s, what, RingFailed, f"rank {plan.rank}")


class RingRank:
    def __init__(self, plan: RingRankPlan, clock: Clock, prev: Channel, nxt: Channel, kv: RingBlocks):
        self.plan, self.clock, self.prev, self.next, self.kv = plan, clock, prev, nxt, kv
        self.prev_rank = (plan.rank - 1) % plan.size
        self.codec = LinkCodec(plan.codec, plan.codec_params, plan.wire_dtype)
        self.result = RingRankResult(plan.rank)
        self._at_layer = 0  # the layer a failure happened at (its ABORT says)
        # Real KV with the sample's queries at this rank: the ring's attention error is measured here.
        self.kept = _Kept(kv, plan.rank) if isinstance(kv, RingKV) and kv.query_rank() == plan.rank else None
        self._shape = kv.block(plan.rank, 0).shape
        self._raw = kv.raw_bytes(self.codec.wire.itemsize)
        # The own block's first hop, per sample layer: made once (a hop's bytes are the same every prompt).
        self._first_hop = [self.codec.encode(kv.block(plan.rank, s), 1) for s in range(kv.sample_layers)]
        # No codec on the links and no accuracy measured here: a received block is forwarded as its bytes.
        self._passes_through = plan.codec == "none" and self.kept is None

    @property
    def block_raw_bytes(self) -> int:
        """One hop's block, uncoded at the wire dtype."""
        return self._raw

    def _where(self, prompt: int, layer: int, hop: int) -> str:
        return f"prompt {prompt}, layer {layer}, hop {hop}"

    async def _send(self, payload: bytes, prompt: int, layer: int, hop: int, at_ns: int) -> None:
        p = self.plan
        occupy = max(len(payload), math.ceil(self._raw * p.module_occupancy)) if p.module_occupancy else None
        await self.next.send(Frame(Kind.PART, p.group, prompt, layer, p.rank, hop, payload=payload), at_ns=at_ns,
                             occupy_bytes=occupy, added_latency_s=p.module_latency_s)
        self.result.hops += 1
        self.result.raw_bytes += self._raw
        self.result.wire_bytes += len(payload)

    async def _receive(self, prompt: int, layer: int, hop: int) -> Frame:
        where = self._where(prompt, layer, hop)
        frame = await _receive_or_fail(self.prev, self.plan, f"rank {self.prev_rank}'s block at {where}")
        expected = (Kind.PART, self.plan.group, prompt, layer, self.prev_rank, hop)
        got = (frame.kind, frame.group, frame.step, frame.layer, frame.rank, frame.chunk)
        if got != expected:
            raise RingFailed(f"rank {self.plan.rank}: at {where} expected block {expected[1:]} from rank "
                             f"{self.prev_rank}, got {frame.kind.name} {got[1:]}")
        return frame

    async def layer(self, prompt: int, layer: int, start_ns: int) -> int:
        """One layer's n steps from model time `start_ns`; returns when the layer was due to end."""
        n, compute_ns = self.plan.size, round(self.plan.compute_s * 1e9)
        t = start_ns
        outgoing = self._first_hop[layer % self.kv.sample_layers]
        for step in range(n):
            compute_end = t + compute_ns
            if step == n - 1:  # the last block: computed on, not passed on
                await self.clock.sleep_until(compute_end)
                return compute_end
            await self._send(outgoing, prompt, layer, step, t)
            frame = await self._receive(prompt, layer, step)
            if self._passes_through:
                # Lossless and nothing kept: the block goes on as it came (decoding and re-encoding it would give
                # the same bytes, at a host cost that grows with the block), once its size is checked.
                if len(frame.payload) != len(outgoing):
                    raise RingFailed(f"rank {self.plan.rank}: rank {self.prev_rank}'s block at "
                                     f"{self._where(prompt, layer, step)} is {len(frame.payload)} B, expected "
                                     f"{len(outgoing)} B")
                outgoing = bytes(frame.payload)
            else:
                try:
                    block = self.codec.decode(frame.payload, self._shape)
                except (BlockError, ValueError) as exc:
                    raise RingFailed(f"rank {self.plan.rank}: rank {self.prev_rank}'s block at "
                                     f"{self._where(prompt, layer, step)} does not decode: {exc}") from None
                source = (self.plan.rank - step - 1) % n
                if self.kept is not None:
                    self.kept.keep(layer, source, block)
                if step + 1 < n - 1:  # made while the hop is still in flight: the host's time, off the model's
                    outgoing = self.codec.encode(block, step + 2)
            await self.prev.hold_until_due(frame)
            await self.clock.sleep_until(compute_end)
            # Measured from when the step was due to start (model time is this host's clock), so a late start
            # of the step is not taken off it, and a late end is counted in full.
            self.result.hop_s.append((self.clock.now_ns() - t) / 1e9)
            t = max(compute_end, frame.due_ns)
        raise AssertionError("unreachable: a ring has at least one step")

    async def prompt(self, prompt: int, start_ns: int) -> int:
        """One prompt's L layers from model time `start_ns` (waited for when still ahead; each layer from when the
        last was due to end); returns when the last was due to end. Its measured time (from its start, or from now
        when that has passed) is appended to the result's `prompt_s`."""
        if self.clock.now_ns() < start_ns:
            await self.clock.sleep_until(start_ns)
        real_ns = self.clock.now_ns()
        model_ns = start_ns
        for layer in range(self.plan.layers):
            self._at_layer = layer
            model_ns = await self.layer(prompt, layer, model_ns)
        self.result.prompt_s.append((self.clock.now_ns() - real_ns) / 1e9)
        return model_ns

    async def run(self, start_ns: int) -> RingRankResult:
        p, result = self.plan, self.result
        prompt = 0
        model_ns = start_ns
        try:
            for prompt in range(p.prompts):
                model_ns = await self.prompt(prompt, model_ns)
        except RingFailed as exc:
            result.ok, result.reason = False, str(exc)
            await self.next.send_quietly(abort(p.group, result.reason, step=prompt, layer=self._at_layer,
                                               rank=p.rank))
        result.late_s = self.prev.late_ns / 1e9
        if result.ok:
            await self.next.send_quietly(Frame(Kind.BYE, p.group, prompt, self._at_layer, p.rank))
            if self.kept is not None:
                result.accuracy = self.kept.error()
        return result
