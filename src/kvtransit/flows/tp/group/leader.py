"""The prefill or decode process as rank 0 of its TP group (`--tp-group JSON`, LeaderConfig): it leads the
followers.

`start` dials each follower's control port (JOIN, then GO: where its next rank or the switch is), joins the ring
or the switch itself, and reads the followers' answers in the background. Each step then `order`s the step (STEP to
every follower, sent as the step begins, so every rank is at the all-reduce when the compute ends) and, after
holding the compute, runs its own part of the real collectives (`allreduce`; with EP the all-to-all too). A
follower's ABORT, a peer gone, a deadline or a wrong sum fails the group with one reason (`GroupFailed`); the
leader fails its requests with it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

from kvtransit.flows.tp.group.exact_step import ExactStep
from kvtransit.flows.tp.group.orders import rank_plan, step_frame
from kvtransit.flows.tp.rank.join import connect_ring, switch_member
from kvtransit.flows.tp.rank.rank import MODE_RING, CollectiveFailed
from kvtransit.runtime.clock import Clock
from kvtransit.runtime.group_link.answers import FollowerAnswers
from kvtransit.runtime.group_link.channel import Channel, PeerGone
from kvtransit.runtime.group_link.connect import RingMember, close_channels, dial_member
from kvtransit.runtime.group_link.follow import go_frame
from kvtransit.runtime.group_link.timing import COLLECTIVE_DEADLINE_S
from kvtransit.wire.group import Frame, Kind, abort

# At the end: how long the leader waits for its followers' answers to the last step (they come within a hop).
ANSWERS_GRACE_S = 1.0


class GroupFailed(Exception):
    """The group cannot step any more; the message is the reason its requests fail with."""


@dataclass(frozen=True)
class LeaderConfig:
    """What the launcher tells a leader about its group (`--tp-group JSON`): the followers' ports as it reaches them
    (its namespace's loopback), and the switch's."""

    group: int
    size: int
    mode: str  # ring | switch
    followers: list[dict[str, Any]] = field(default_factory=list)  # per rank 1..n−1: {"control": [h, p], "ring": …}
    switch: list[Any] | None = None  # [host, port] with mode switch
    host: str = "127.0.0.1"  # where the leader's own ring port listens (rank n − 1 dials it)
    deadline_s: float = COLLECTIVE_DEADLINE_S

    def __post_init__(self) -> None:
        if len(self.followers) != self.size - 1:
            raise ValueError(f"--tp-group: a group of {self.size} has {self.size - 1} followers, got "
                             f"{len(self.followers)}")
        if self.mode != MODE_RING and not self.switch:
            raise ValueError("--tp-group: a switch group needs the switch's address")


class GroupLeader:
    def __init__(self, config: LeaderConfig, clock: Clock, *, rate_Bps: float, latency_s: float):
        self.config, self.clock = config, clock
        self.rate_Bps, self.latency_s = rate_Bps, latency_s
        self.plan = rank_plan(config.group, 0, config.size, config.mode, config.deadline_s)
        self.controls: list[Channel] = []
        self._step: ExactStep | None = None
        self.answers = FollowerAnswers("rank")  # DONE: a follower's sum found exact

    async def start(self) -> None:
        config, plan = self.config, self.plan
        ring = RingMember(plan, self.clock, rate_Bps=self.rate_Bps, latency_s=self.latency_s) \
            if config.mode == MODE_RING else None
        try:
            my_port = await ring.listen(config.host) if ring is not None else 0
            for r, follower in enumerate(config.followers, start=1):
                control = await dial_member(plan, self.clock, follower["control"], r, f"rank {r}",
                                            rate_Bps=self.rate_Bps, latency_s=self.latency_s)
                self.controls.append(control)
                if ring is not None:
                    nxt = config.followers[r]["ring"] if r < config.size - 1 else [config.host, my_port]
                    await control.send(go_frame(plan.group, {"next": nxt}), shaped=False)
                else:
                    await control.send(go_frame(plan.group, {"switch": config.switch}), shaped=False)
            if ring is not None:
                algorithm = await connect_ring(ring, *config.followers[0]["ring"])
            else:
                assert config.switch is not None  # LeaderConfig checks it
                algorithm = await switch_member(plan, self.clock, str(config.switch[0]), int(config.switch[1]),
                                                rate_Bps=self.rate_Bps, latency_s=self.latency_s)
        except PeerGone as exc:
            await self.close()
            raise GroupFailed(f"the TP group did not form: {exc}") from None
        finally:
            if ring is not None:
                await ring.close()
        self._step = ExactStep(plan, algorithm)
        self.answers.start(self.controls)

    @property
    def failure(self) -> str | None:
        return self.answers.failure

    @property
    def followers_done(self) -> int:
        """DONE answers: follower sums found exact."""
        return self.answers.done

    def _fail(self, reason: str) -> None:
        self.answers.fail(reason)

    async def order(self, step: int, values: int, at_ns: int, alltoall_values: int = 0) -> None:
        """Tell every follower step `step`'s sizes and when its all-reduce starts."""
        self._check()
        frame = step_frame(self.plan.group, step, values, at_ns, alltoall_values)
        self.answers.ordered()
        try:
            for control in self.controls:
                await control.send(frame, shaped=False)
        except PeerGone as exc:
            self._fail(str(exc))
            self._check()

    async def allreduce(self, step: int, values: int, at_ns: int, alltoall_values: int = 0) -> int:
        """Rank 0's part of step `step`'s all-reduce (and, with EP, all-to-all); when the last was due (model
        time)."""
        self._check()
        assert self._step is not None, "start() first"
        try:
            return await self._step.run(step, values, at_ns, alltoall_values)
        except CollectiveFailed as exc:
            self._fail(str(exc))
            await self._step.algorithm.fail(str(exc))
            for control in self.controls:
                await control.send_quietly(abort(self.plan.group, str(exc)))
            raise GroupFailed(f"TP group failed: {self.failure}") from None

    def _check(self) -> None:
        if self.failure is not None:
            raise GroupFailed(f"TP group failed: {self.failure}")

    @property
    def sums_checked(self) -> int:
        return self._step.sums_checked if self._step is not None else 0

    @property
    def alltoalls_checked(self) -> int:
        return self._step.alltoalls if self._step is not None else 0

    @property
    def late_ns(self) -> int:
        return self._step.late_ns if self._step is not None else 0

    async def close(self) -> None:
        """BYE to every follower (its process ends) and the ring or switch, then close everything; the followers'
        answers to the last step are waited for first, briefly (the counts in /stats are then whole)."""
        await self.answers.close(ANSWERS_GRACE_S)
        bye = Frame(Kind.BYE, self.plan.group, rank=0)
        for control in self.controls:
            await control.send_quietly(bye)
        if self._step is not None:
            for channel in self._step.algorithm.channels:
                await channel.send_quietly(bye)
            await close_channels(self._step.algorithm)
        for control in self.controls:
            with contextlib.suppress(Exception):
                await control.close()
