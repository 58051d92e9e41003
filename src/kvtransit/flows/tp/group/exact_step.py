"""One step's collectives as a serving group's rank runs them: its part of that step's size, the real all-reduce
(ring or switch, flows/tp/rank/rank.py), and the check that what came back is the exact sum of every rank's
part (flows/tp/rank/payloads.py), so a wrong sum is a failed step, never a silent one; with EP, then the real
all-to-all round the ring, every chunk checked against what its sender's part is."""

from __future__ import annotations

import numpy as np

from kvtransit.flows.tp.rank.payloads import Payloads
from kvtransit.flows.tp.rank.rank import CollectiveFailed, RankPlan, _Ring, _Switch

# A step's size depends on the batch (a decode's sequences, a prefill's tokens), so the parts are views of one
# table as long as the largest step seen (grown by doubling): making a table costs ~20 ns a value (a 4 Mi-value
# prefill step's would take ~0.1 s), a view nothing.
GROWTH = 2


class ExactStep:
    def __init__(self, plan: RankPlan, algorithm: _Ring | _Switch):
        self.plan, self.algorithm = plan, algorithm
        self._payloads = Payloads(self.plan.size, self.plan.size)
        self.sums_checked = 0
        self.alltoalls = 0  # all-to-alls whose every chunk came as its sender made it

    def _for(self, values: int) -> Payloads:
        """A table of at least `values` values (its parts and sums sliced to a step's size stay exact)."""
        if self._payloads.values < values:
            self._payloads = Payloads(max(values, GROWTH * self._payloads.values), self.plan.size)
        return self._payloads

    async def run(self, step: int, values: int, at_ns: int, alltoall_values: int = 0) -> int:
        """All-reduce step `step`'s `values` values, leaving at `at_ns`, then (EP) all-to-all `alltoall_values` a
        hop; returns when the last was due (model time). Raises CollectiveFailed (a peer gone, a deadline, a wrong
        sum or chunk) with the one reason."""
        if values % self.plan.size:
            raise CollectiveFailed(f"rank {self.plan.rank}: step {step} orders {values} values, not a multiple of "
                                   f"the group's {self.plan.size}")
        payloads = self._for(values)
        part = payloads.part(self.plan.rank, step, 0)[:values]
        total, end_ns = await self.algorithm.allreduce(part, step, 0, at_ns)
        if wrong := payloads.wrong_values(total, step, 0, values):
            raise CollectiveFailed(f"rank {self.plan.rank} found a wrong sum at step {step} ({wrong} of {values} "
                                   "values differ from the exact sum)")
        self.sums_checked += 1
        if alltoall_values:
            if not isinstance(self.algorithm, _Ring):
                raise CollectiveFailed(f"rank {self.plan.rank}: an all-to-all goes between the ranks, not a switch")
            end_ns = await self.algorithm.alltoall(_Sized(self._for(alltoall_values), alltoall_values), step, 0, end_ns)
            self.alltoalls += 1
        return end_ns

    @property
    def late_ns(self) -> int:
        """Σ how late the all-reduces' frames came after their due times: what this host added to the model."""
        return sum(channel.late_ns for channel in self.algorithm.channels)


class _Sized:
    """A table's parts cut to one step's size: what `_Ring.alltoall` asks of its Payloads (`part`, `phase`)."""

    def __init__(self, table: Payloads, values: int):
        self.table, self.values = table, values

    def part(self, rank: int, step: int, collective: int) -> np.ndarray:
        return self.table.part(rank, step, collective)[:self.values]

    def phase(self, rank: int, step: int, collective: int) -> int:
        return self.table.phase(rank, step, collective)
