"""One step's all-reduce as a serving group's rank runs it: its part of that step's size, the real all-reduce
(ring or switch, agents/collective/rank.py), and the check that what came back is the exact sum of every rank's
part (agents/collective/payloads.py), so a wrong sum is a failed step, never a silent one."""

from __future__ import annotations

import numpy as np

from kvtransit.agents.collective.payloads import Payloads
from kvtransit.agents.collective.rank import CollectiveFailed, RankPlan, _Ring, _Switch

# A step's size depends on the batch (values ∝ sequences running), so the parts are made once per size seen;
# a decode batch has at most MAX_DECODE_BATCH sizes (model/serving.py), this bounds the memory all the same.
MAX_SIZES = 512


class ExactStep:
    def __init__(self, plan: RankPlan, algorithm: _Ring | _Switch):
        self.plan, self.algorithm = plan, algorithm
        self._payloads: dict[int, Payloads] = {}
        self.sums_checked = 0

    def _for(self, values: int) -> Payloads:
        payloads = self._payloads.get(values)
        if payloads is None:
            if len(self._payloads) >= MAX_SIZES:
                self._payloads.clear()
            payloads = self._payloads[values] = Payloads(values, self.plan.size)
        return payloads

    async def run(self, step: int, values: int, at_ns: int) -> int:
        """All-reduce step `step`'s `values` values, leaving at `at_ns`; returns when the sum was due (model
        time). Raises CollectiveFailed (a peer gone, a deadline, a wrong sum) with the one reason."""
        if values % self.plan.size:
            raise CollectiveFailed(f"rank {self.plan.rank}: step {step} orders {values} values, not a multiple of "
                                   f"the group's {self.plan.size}")
        payloads = self._for(values)
        total, end_ns = await self.algorithm.allreduce(payloads.part(self.plan.rank, step, 0), step, 0, at_ns)
        if not payloads.is_exact_sum(total, step, 0):
            wrong = int(np.count_nonzero(total.view(np.uint16) != payloads.expected(step, 0).view(np.uint16)))
            raise CollectiveFailed(f"rank {self.plan.rank} found a wrong sum at step {step} ({wrong} of {values} "
                                   "values differ from the exact sum)")
        self.sums_checked += 1
        return end_ns

    @property
    def late_ns(self) -> int:
        """Σ how late the all-reduces' frames came after their due times: what this host added to the model."""
        return sum(channel.late_ns for channel in self.algorithm.channels)
