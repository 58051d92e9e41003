"""A ring inside `kvtransit up` (flows/ring/ring_class.py): the prefill instance's GPU is rank 0 and
leads n − 1 ring follower processes (follower.py), one prompt at a time.

The shape is a TP group's (flows/tp/group/): the launcher starts the followers first, each binds a control port
and a ring port and prints its readiness line; the prefill (`--ring-group JSON`, RingGroupConfig) dials each
control port, says GO (where its next rank listens), and joins the ring itself. Each ring request's prefill then
`prompt`s the group: an ORDER to every follower (the prompt's number and when its attention starts, unshaped, as a
host broadcasts a step's metadata to its workers), then rank 0's own part of the ring (flows/ring/rank.py:
`RingRank.prompt`, the very layers `kvtransit ring` runs). A follower answers DONE after each prompt, or ABORT with
the reason; a peer gone, a deadline or a frame out of order fails the prompt for every rank with one reason, and
the group with it (`RingGroupFailed`): the prefill fails that request, and every later ring request, with it, while
its other requests go on.

Every process of a ring runs where its prefill runs (its namespace in netns mode), on its loopback, so the orders'
times are on one monotonic clock. The blocks are synthetic KV at the run's scale (blocks.py: SyntheticRingKV) and
the ring link is the scenario's, scaled by the blocks' channels and dilated as the hand-off's
(Scenario.ring_scale, scaled_ring_link).
"""

from __future__ import annotations

import contextlib
import json
import struct
from dataclasses import asdict, dataclass, field
from typing import Any

from kvtransit.flows.ring.blocks import SyntheticRingKV
from kvtransit.flows.ring.rank import RingFailed, RingRank, RingRankPlan
from kvtransit.flows.ring.section import RingSection
from kvtransit.model.scenario import Scenario
from kvtransit.runtime.clock import Clock
from kvtransit.runtime.group_link.answers import FollowerAnswers
from kvtransit.runtime.group_link.channel import Channel, PeerGone
from kvtransit.runtime.group_link.connect import RingMember, dial_member
from kvtransit.runtime.group_link.follow import go_frame
from kvtransit.runtime.group_link.timing import COLLECTIVE_DEADLINE_S
from kvtransit.wire.group import Frame, Kind, abort

# A prefill's ring group id: this + its index (TP groups take 1.. for decodes and 1001.. for prefills).
RING_GROUP_BASE = 2001
_AT = struct.Struct("!Q")  # an ORDER's payload: when the prompt's attention starts (monotonic ns)
# At the end: how long the leader waits for its followers' answers to the last prompt (they come within a hop).
ANSWERS_GRACE_S = 1.0


@dataclass(frozen=True)
class RingPromptDone:
    """What one ring prompt did on rank 0's side: when its last layer was due to end, and its hops' bytes."""

    due_end_ns: int
    hops: int
    raw_bytes: int  # the blocks rank 0 sent on, at the run's scale, before any codec


class RingGroupFailed(Exception):
    """The ring cannot run any more prompts; the message is the reason its requests fail with."""


def ring_group_id(index: int) -> int:
    return RING_GROUP_BASE + index


def rank_plan(scenario: Scenario, index: int, rank: int) -> RingRankPlan:
    """Rank `rank` of prefill `index`'s ring: the model's layers, each step's blockwise attention held for the
    model's time × dilation (flows/ring/model.py), no codec on the ring's links."""
    ring_section = RingSection.of(scenario)
    model = ring_section.model(scenario)
    return RingRankPlan(group=ring_group_id(index), rank=rank, size=ring_section.ring_ranks, layers=model.layers,
                        prompts=0, compute_s=scenario.wall_s(model.hop.compute_s), sample="", text="",
                        deadline_s=COLLECTIVE_DEADLINE_S)


def ring_blocks(scenario: Scenario) -> SyntheticRingKV:
    """The ring's blocks at the ring's scale: ring_prompt / n tokens of `Scenario.ring_layout`'s channels."""
    ring_section = RingSection.of(scenario)
    layout = ring_section.layout(scenario)
    return SyntheticRingKV(n=ring_section.ring_ranks, block_tokens=ring_section.model(scenario).block_tokens,
                           kv_heads=layout.kv_heads, head_dim=layout.head_dim, seed=scenario.seed)


@dataclass(frozen=True)
class RingFollowerConfig:
    """`python -m kvtransit.flows.ring.follower --config JSON`: rank `rank` of prefill `index`'s ring."""

    index: int
    rank: int
    host: str = "127.0.0.1"  # where it listens: its prefill's namespace's loopback
    leader: str = "prefill-0"
    scenario: dict[str, Any] = field(default_factory=dict)  # Scenario.as_dict(): the run's one scenario

    def to_json(self) -> str:
        return json.dumps(asdict(self))


@dataclass(frozen=True)
class RingGroupConfig:
    """What the launcher tells a prefill about its ring (`--ring-group JSON`): its followers' ports as it reaches
    them (its namespace's loopback)."""

    index: int
    followers: list[dict[str, Any]] = field(default_factory=list)  # per rank 1..n−1: {"control": [h, p], "ring": …}
    host: str = "127.0.0.1"  # where the leader's own ring port listens (rank n − 1 dials it)

    def check(self, scenario: Scenario) -> None:
        ring_section = RingSection.of(scenario)
        if len(self.followers) != ring_section.ring_ranks - 1:
            raise ValueError(f"--ring-group: a ring of {ring_section.ring_ranks} has {ring_section.ring_ranks - 1} "
                             f"followers, got {len(self.followers)}")


def order_frame(group: int, prompt: int, at_ns: int) -> Frame:
    """ORDER (a STEP frame): run prompt `prompt`'s layers, its first from `at_ns`."""
    return Frame(Kind.STEP, group, prompt, payload=_AT.pack(at_ns))


def read_order(frame: Frame) -> int:
    """When an ORDER's prompt starts (ns)."""
    return int(_AT.unpack(bytes(frame.payload))[0])


class RingGroupLeader:
    """Rank 0 of a prefill's ring (the module docstring)."""

    def __init__(self, config: RingGroupConfig, scenario: Scenario, clock: Clock):
        config.check(scenario)
        self.config, self.scenario, self.clock = config, scenario, clock
        self.plan = rank_plan(scenario, config.index, 0)
        link = RingSection.of(scenario).scaled_link(scenario)
        self.rate_Bps, self.latency_s = link.bandwidth_Bps, link.latency_s
        self.controls: list[Channel] = []
        self.rank: RingRank | None = None
        self.answers = FollowerAnswers("ring rank")  # DONE: a follower ran its part of a prompt

    async def start(self) -> None:
        config, plan = self.config, self.plan
        ring = RingMember(plan, self.clock, rate_Bps=self.rate_Bps, latency_s=self.latency_s)
        try:
            my_port = await ring.listen(config.host)
            size = plan.size
            for r, follower in enumerate(config.followers, start=1):
                control = await dial_member(plan, self.clock, follower["control"], r, f"ring rank {r}",
                                            rate_Bps=self.rate_Bps, latency_s=self.latency_s)
                self.controls.append(control)
                nxt = config.followers[r]["ring"] if r < size - 1 else [config.host, my_port]
                await control.send(go_frame(plan.group, {"next": nxt}), shaped=False)
            prev, nxt_channel = await ring.connect_channels(*config.followers[0]["ring"])
        except PeerGone as exc:
            await self.close()
            raise RingGroupFailed(f"the ring did not form: {exc}") from None
        finally:
            await ring.close()
        self.rank = RingRank(plan, self.clock, prev, nxt_channel, ring_blocks(self.scenario))
        self.answers.start(self.controls)

    @property
    def failure(self) -> str | None:
        return self.answers.failure

    @property
    def prompts(self) -> int:
        """Ring prompts ordered."""
        return self.answers.orders

    def _check(self) -> None:
        if self.failure is not None:
            raise RingGroupFailed(f"ring attention failed: {self.failure}")

    async def prompt(self, at_ns: int) -> RingPromptDone:
        """One ring request's attention, from `at_ns` (monotonic ns, the model's start): the followers are ordered,
        then rank 0 runs its part; returns when it was due to end and its hops. Raises RingGroupFailed."""
        self._check()
        assert self.rank is not None, "start() first"
        number = self.prompts
        hops_before = self.rank.result.hops
        self.answers.ordered()
        try:
            for control in self.controls:
                await control.send(order_frame(self.plan.group, number, at_ns), shaped=False)
            due_end_ns = await self.rank.prompt(number, at_ns)
            hops = self.rank.result.hops - hops_before
            return RingPromptDone(due_end_ns, hops, hops * self.rank.block_raw_bytes)
        except (PeerGone, RingFailed) as exc:
            self.answers.fail(str(exc))
            await self.rank.next.send_quietly(abort(self.plan.group, str(exc), step=number, rank=0))
            for control in self.controls:
                await control.send_quietly(abort(self.plan.group, str(exc), step=number))
            raise RingGroupFailed(f"ring attention failed: {self.failure}") from None

    def stats(self) -> dict[str, Any]:
        """Rank 0's side of the ring (hops, bytes, lateness); the prompts' times are the prefill's to keep."""
        result = self.rank.result if self.rank is not None else None
        return {"ranks": self.plan.size, "prompts_ordered": self.prompts, "followers_done": self.answers.done,
                "hops": result.hops if result else 0, "raw_bytes": result.raw_bytes if result else 0,
                "wire_bytes": result.wire_bytes if result else 0,
                "late_s": (self.rank.prev.late_ns / 1e9) if self.rank is not None else 0.0,
                "failure": self.failure}

    async def close(self) -> None:
        """BYE to every follower (its process ends) and round the ring, after the last prompt's answers (briefly)."""
        await self.answers.close(ANSWERS_GRACE_S)
        bye = Frame(Kind.BYE, self.plan.group, rank=0)
        for control in self.controls:
            await control.send_quietly(bye)
        if self.rank is not None:
            await self.rank.next.send_quietly(bye)
            for channel in (self.rank.prev, self.rank.next):
                with contextlib.suppress(Exception):
                    await channel.close()
        for control in self.controls:
            with contextlib.suppress(Exception):
                await control.close()
