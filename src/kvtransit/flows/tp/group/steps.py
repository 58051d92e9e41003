"""A TP group's steps as they ran (`--prefill-tp` / `--decode-tp N`), in the process that leads it (the prefill or
the decode, rank 0): each step's collective time measured beside the model's, into /stats (`tp_group`, the report's
`collectives` block) and the metrics (`kvtransit_tp_*`, by role).

Measured, per step, as `kvtransit collective` measures its steps: from the previous step's end as stamped (or, after
idling, the schedule's start) to the wake-up that ended its held compute, and from there to the step's end as
stamped (the real all-reduce and the rest of the collective time held); all in model seconds (÷ dilation). A host
that cannot carry the real all-reduce in the modelled time shows twice: the step ends late (the fidelity guard's
timer lateness) and the measured share of the step in collectives rises above the model's. The model's figures are
the plan's (flows/tp/group_step.py). The real all-reduce's frames' lateness against their due times on the modelled
scale-up link is what this host added to the model.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

from kvtransit.flows.tp.group_step import GroupCollectives
from kvtransit.flows.tp.metrics import TpGroupMetrics, tp_group_metrics
from kvtransit.flows.tp.section import TpSection
from kvtransit.model.judge.slo import percentile
from kvtransit.model.scenario import Scenario
from kvtransit.runtime.clock import Clock, wake_stamp_ns

if TYPE_CHECKING:
    from kvtransit.flows.tp.group.leader import GroupLeader


STEP_SAMPLES = 10_000


def _percentile(values: deque[float], q: float) -> float | None:
    """`model.slo.percentile` (the report's own), None before any step."""
    return percentile(values, q) if values else None


class StepTimes(Protocol):
    """A step's plan as the group measures it (model/serving/decode_plan.py's and model/serving/prefill_plan.py's): its
    modelled time, the collectives' part, what went for real."""

    @property
    def model_s(self) -> float: ...
    @property
    def collective_s(self) -> float: ...
    @property
    def extra(self) -> Any: ...


class TpSteps:
    def __init__(self, scenario: Scenario, role: str, registry, *, size: int, parallelism: str):
        self.scenario, self.role, self.size, self.parallelism = scenario, role, size, parallelism
        metrics: TpGroupMetrics = tp_group_metrics(registry)
        self._collective = {src: metrics.collective_seconds.labels(role=role, source=src)
                            for src in ("measured", "model")}
        self._step = {src: metrics.step_seconds.labels(role=role, source=src) for src in ("measured", "model")}
        self._late = metrics.collective_late_seconds.labels(role=role)
        self.steps = 0
        self.measured = {"step_s": 0.0, "collective_s": 0.0, "allreduce_s": 0.0}
        self.model = {"step_s": 0.0, "collective_s": 0.0, "allreduce_s": 0.0}
        self.real_values = 0  # BF16 values all-reduced for real (at scale), rank 0's part
        self.late_ns = 0
        self.overruns = 0  # steps whose real all-reduce ended after the step was due to end
        self._last_end_ns: int | None = None
        # Each step's measured / modelled time, the latest STEP_SAMPLES: the means above telescope (steps are on
        # absolute deadlines, a late one is followed by a short one), this shows the spread.
        self._ratios: deque[float] = deque(maxlen=STEP_SAMPLES)

    def record(self, plan: StepTimes, *, fresh_start_ns: int | None, compute_end_ns: int, reduced_ns: int,
               end_ns: int, due_ns: int, late_ns: int) -> None:
        """One step: `fresh_start_ns` when a new schedule began it after idling (None: it followed the last step),
        its compute's wake-up at `compute_end_ns`, the real all-reduce done at `reduced_ns`, the step's end stamped
        `end_ns` (due at `due_ns`); `late_ns` the group's running lateness of frames."""
        group = plan.extra
        assert isinstance(group, GroupCollectives)
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
        if plan.model_s > 0:
            self._ratios.append(step_s / plan.model_s)
        self.measured["collective_s"] += collective_s
        self.measured["allreduce_s"] += model_s((reduced_ns - compute_end_ns) / 1e9)
        self.model["step_s"] += plan.model_s
        self.model["collective_s"] += plan.collective_s
        self.model["allreduce_s"] += group.real_model_s
        self.real_values += group.values
        self.overruns += reduced_ns > due_ns
        self._collective["measured"].inc(max(0.0, collective_s))
        self._collective["model"].inc(plan.collective_s)
        self._step["measured"].inc(max(0.0, step_s))
        self._step["model"].inc(plan.model_s)
        self._late.inc(max(0, late_ns - self.late_ns) / 1e9)
        self.late_ns = late_ns

    async def run(self, group: GroupLeader, clock: Clock, plan: StepTimes, *, fresh_start_ns: int | None,
                  compute_end_ns: int, end_ns: int) -> int:
        """One step of the group led here: order it, hold the compute until `compute_end_ns`, run this rank's part of
        the real collectives (their hops held to the scale-up link's model), hold until `end_ns` (the rest of the
        collective time), record it; the lateness of the step's end (a real collective that outlasted its step
        shows here, as a late wake-up). Raises GroupFailed."""
        group_step = plan.extra
        assert isinstance(group_step, GroupCollectives)
        step, values, alltoall = self.steps, group_step.values, group_step.alltoall_values
        await group.order(step, values, compute_end_ns, alltoall)
        compute_late_ns = await clock.sleep_until(compute_end_ns)
        await group.allreduce(step, values, compute_end_ns, alltoall)
        reduced_ns = clock.now_ns()
        late_ns = await clock.sleep_until(end_ns)
        self.record(plan, fresh_start_ns=fresh_start_ns, compute_end_ns=wake_stamp_ns(compute_end_ns, compute_late_ns),
                    reduced_ns=reduced_ns, end_ns=wake_stamp_ns(end_ns, late_ns), due_ns=end_ns,
                    late_ns=group.late_ns)
        return late_ns

    def stats(self, group: GroupLeader | None) -> dict[str, Any]:
        tp_section = TpSection.of(self.scenario)

        def share(sums: dict[str, float]) -> float | None:
            return sums["collective_s"] / sums["step_s"] if sums["step_s"] > 0 else None

        return {
            "role": self.role,
            "size": self.size,
            "parallelism": self.parallelism,  # ep: EP = TP = size, all-to-alls too
            "allreduce": tp_section.allreduce,
            "scaleup_link": tp_section.scaleup_link,
            # flows/tp/group_step.py: one real all-reduce a step carries the step's all-reduces' bytes (with EP one real
            # all-to-all its all-to-alls'); the other latency terms are held (a 5 µs NVLink hop is under this host's
            # cost of a hop in Python).
            "granularity": "step",
            "processes": self.size - 1 + (1 if tp_section.allreduce == "switch" else 0),
            "steps": self.steps,
            "measured": dict(self.measured),
            "model": dict(self.model),
            "step_ratio": {"p50": _percentile(self._ratios, 50), "p99": _percentile(self._ratios, 99)},
            "measured_collective_share": share(self.measured),
            "model_collective_share": share(self.model),
            "real_bytes_per_step": 2 * self.real_values / self.steps if self.steps else None,
            "late_s": self.late_ns / 1e9,
            "overrun_steps": self.overruns,
            "sums_checked": group.sums_checked if group is not None else 0,
            "alltoalls_checked": group.alltoalls_checked if group is not None else 0,
            "follower_sums_checked": group.followers_done if group is not None else 0,
            "failure": group.failure if group is not None else None,
        }
