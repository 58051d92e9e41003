"""A decode TP group's steps as they ran (`--decode-tp N`): each step's collective time measured beside the
model's, into /stats (the report's `collectives` block) and the metrics.

Measured, per step, as `kvtransit collective` measures its steps: from the previous step's end as stamped (or, after
idling, the schedule's start) to the wake-up that ended its held compute, and from there to the step's end as
stamped (the real all-reduce and the rest of the collective time held); all in model seconds (÷ dilation). A host
that cannot carry the real all-reduce in the modelled time shows twice: the step ends late (the fidelity guard's
timer lateness) and the measured share of the step in collectives rises above the model's. The model's figures are
the plan's (model/decode_plan.py). The real all-reduce's frames' lateness against their due times on the modelled
scale-up link is what this host added to the model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvtransit.model.decode_plan import DecodeStepPlan
from kvtransit.model.scenario import Scenario
from kvtransit.runtime.metrics import DecodeMetrics

if TYPE_CHECKING:
    from kvtransit.agents.tp_group.leader import GroupLeader


class TpSteps:
    def __init__(self, scenario: Scenario, metrics: DecodeMetrics):
        self.scenario, self.metrics = scenario, metrics
        self.steps = 0
        self.measured = {"step_s": 0.0, "collective_s": 0.0, "allreduce_s": 0.0}
        self.model = {"step_s": 0.0, "collective_s": 0.0, "allreduce_s": 0.0}
        self.real_values = 0  # BF16 values all-reduced for real (at scale), rank 0's part
        self.late_ns = 0
        self.overruns = 0  # steps whose real all-reduce ended after the step was due to end
        self._last_end_ns: int | None = None

    def record(self, plan: DecodeStepPlan, *, fresh_start_ns: int | None, compute_end_ns: int, reduced_ns: int,
               end_ns: int, due_ns: int, late_ns: int) -> None:
        """One step: `fresh_start_ns` when a new schedule began it after idling (None: it followed the last step),
        its compute's wake-up at `compute_end_ns`, the real all-reduce done at `reduced_ns`, the step's end stamped
        `end_ns` (due at `due_ns`); `late_ns` the group's running lateness of frames."""
        assert plan.group is not None
        if fresh_start_ns is not None:
            start_ns = fresh_start_ns
        else:
            assert self._last_end_ns is not None, "a step that follows another needs that one recorded"
            start_ns = self._last_end_ns
        self._last_end_ns = end_ns
        model_s = self.scenario.model_s
        step_s, collective_s = model_s((end_ns - start_ns) / 1e9), model_s((end_ns - compute_end_ns) / 1e9)
        self.steps += 1
        self.measured["step_s"] += step_s
        self.measured["collective_s"] += collective_s
        self.measured["allreduce_s"] += model_s((reduced_ns - compute_end_ns) / 1e9)
        self.model["step_s"] += plan.model_s
        self.model["collective_s"] += plan.collective_s
        self.model["allreduce_s"] += plan.group.real_model_s
        self.real_values += plan.group.values
        self.overruns += reduced_ns > due_ns
        self.metrics.collective_seconds.labels(source="measured").inc(max(0.0, collective_s))
        self.metrics.collective_seconds.labels(source="model").inc(plan.collective_s)
        self.metrics.group_step_seconds.labels(source="measured").inc(max(0.0, step_s))
        self.metrics.group_step_seconds.labels(source="model").inc(plan.model_s)
        self.metrics.collective_late_seconds.inc(max(0, late_ns - self.late_ns) / 1e9)
        self.late_ns = late_ns

    def stats(self, group: GroupLeader | None) -> dict[str, Any]:
        scenario = self.scenario

        def share(sums: dict[str, float]) -> float | None:
            return sums["collective_s"] / sums["step_s"] if sums["step_s"] > 0 else None

        return {
            "size": scenario.decode_tp,
            "allreduce": scenario.allreduce,
            "scaleup_link": scenario.scaleup_link,
            # model/decode_plan.py: one real all-reduce a step carries the 2·L all-reduces' bytes; the other
            # latency terms are held (a 5 µs NVLink hop is under this host's cost of a hop in Python).
            "granularity": "step",
            "processes": scenario.decode_tp - 1 + (1 if scenario.allreduce == "switch" else 0),
            "steps": self.steps,
            "measured": dict(self.measured),
            "model": dict(self.model),
            "measured_collective_share": share(self.measured),
            "model_collective_share": share(self.model),
            "real_bytes_per_step": 2 * self.real_values / self.steps if self.steps else None,
            "late_s": self.late_ns / 1e9,
            "overrun_steps": self.overruns,
            "sums_checked": group.sums_checked if group is not None else 0,
            "follower_sums_checked": group.followers_done if group is not None else 0,
            "failure": group.failure if group is not None else None,
        }
