"""What the leader and its followers say on their control connections, and what both ends know of the group.

The leader (the decode process, rank 0) tells each follower where its ring neighbour or the switch is (GO, once),
then each step's order (STEP: the step number, when its compute ends and the all-reduce starts, how many BF16
values the all-reduce carries); a follower answers DONE once its sum of that step was exact, or ABORT with the
reason. Every process of a group is on one host (the TP group is one server's GPUs), so the monotonic clock the
orders' times are on is shared. Framed by wire/group.py.
"""

from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass

from kvtransit.flows.tp.rank.rank import RankPlan
from kvtransit.runtime.group_link.answers import IDLE_WAIT_S as ANSWERS_IDLE_WAIT_S
from kvtransit.runtime.group_link.timing import COLLECTIVE_DEADLINE_S
from kvtransit.wire.group import Frame, Kind

_ORDER = struct.Struct("!IIQ")  # all-reduce values, all-to-all values a hop (0: none), at_ns
# Between steps the group waits for the next order (and the leader for answers) as long as the decode idles: the
# run's length, not a fault (the answers' own wait, runtime/group_link/answers.py).
IDLE_WAIT_S = ANSWERS_IDLE_WAIT_S


@dataclass(frozen=True)
class GroupLink:
    """The group's scale-up link as the emulation shapes it (rate at the run's scale ÷ dilation, latency ×
    dilation) and, for a switch, its module's added latency × dilation."""

    rate_Bps: float
    latency_s: float


@dataclass(frozen=True)
class FollowerConfig:
    """`python -m kvtransit.flows.tp.group --config JSON`: one follower rank of the group `leader` leads."""

    group: int
    rank: int
    size: int
    mode: str  # ring | switch
    rate_Bps: float
    latency_s: float
    deadline_s: float = COLLECTIVE_DEADLINE_S
    host: str = "127.0.0.1"  # where it listens: its leader's namespace's loopback
    leader: str = "decode-0"  # the process that leads the group, for this one's name

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    def plan(self) -> RankPlan:
        return rank_plan(self.group, self.rank, self.size, self.mode, self.deadline_s)


def rank_plan(group: int, rank: int, size: int, mode: str, deadline_s: float) -> RankPlan:
    """A rank of a serving group: no fixed step count or size (each step's order says), one all-reduce a step."""
    return RankPlan(group=group, rank=rank, size=size, mode=mode, steps=0, collectives=1, values=0, compute_s=0.0,
                    held_s=0.0, deadline_s=deadline_s)


def step_frame(group: int, step: int, values: int, at_ns: int, alltoall_values: int = 0) -> Frame:
    """STEP: step `step` all-reduces `values` BF16 values, then (EP) all-to-alls `alltoall_values` a ring hop,
    starting at `at_ns` (in the payload: the frame goes unshaped, as a host broadcasts a step's metadata to its
    workers, and its `due_ns` is the sender's now)."""
    return Frame(Kind.STEP, group, step, payload=_ORDER.pack(values, alltoall_values, at_ns))


def read_step(frame: Frame) -> tuple[int, int, int]:
    """(values, alltoall_values, at_ns) of a STEP order."""
    values, alltoall_values, at_ns = _ORDER.unpack(bytes(frame.payload))
    return int(values), int(alltoall_values), int(at_ns)
