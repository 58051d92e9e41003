"""What a TP group's live step carries as real bytes and what it holds (`--prefill-tp`, `--decode-tp N`), the
same for the prefill's steps and the decode's.

A step's collectives (flows/tp/model.py: `ParallelStep`, 2·L all-reduces dense, L all-reduces and L all-to-alls
with EP) go as one real all-reduce a step carrying every all-reduce's bytes at the run's scale, with one set of
latencies, and with EP one real all-to-all carrying every layer's dispatch and combine likewise; the other latency
terms are held on the clock. A modelled hop over NVLink is 5 µs, under what a hop costs this host in Python
(~100-250 µs, flows/tp/run.py: HOST_HOP_S), so per-layer messages could not keep up at any dilation a
serving run uses; `kvtransit collective --granularity layer` is where per-layer messages are measured.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from kvtransit.flows.tp.model import ParallelStep, allreduce_s
from kvtransit.model.sections import StepExtra

if TYPE_CHECKING:
    from kvtransit.flows.tp.section import TpSection
    from kvtransit.model.scenario import Scenario


@dataclass(frozen=True)
class GroupCollectives(StepExtra):
    """One real all-reduce of `values` BF16 values (a multiple of the group size) and, with EP, one real all-to-all
    whose 2(n − 1) ring hops carry `alltoall_values` each; the model says they take `real_model_s`, and `held_s`
    more (the other collectives' latency terms), both model seconds."""

    FLOW: ClassVar[str] = "tp"

    values: int
    real_model_s: float
    held_s: float
    alltoall_values: int = 0


def live_collectives(scenario: Scenario, tp: TpSection, n: int, step: ParallelStep) -> GroupCollectives:
    """`step`'s collectives (the model's, of a group of `n` on the scenario's scale-up link) as the live group runs
    them: real at the run's scale, the rest held."""
    model, link = scenario.model_spec, tp.link_spec
    # one all-reduce's values: tokens × d (docs/reference.md §7.2)
    per_reduce = step.allreduce_bytes // model.bytes_per_value
    values = max(n, math.ceil(step.allreduces * per_reduce * scenario.effective_scale / n) * n)
    real_s = allreduce_s(step.allreduce_kind, step.allreduces * step.allreduce_bytes, n, link, scenario.module)
    alltoall_values = 0
    if step.alltoalls:
        # A hop of the ring all-to-all carries 1/n of the tokens' k activations (flows/tp/rank/rank.py: alltoall);
        # the step's L all-to-alls' bytes go in one, with one set of 2(n − 1) latencies.
        tokens = per_reduce // model.d_model
        alltoall_values = max(1, math.ceil(step.alltoalls * tokens * model.experts_active * model.d_model / n
                                           * scenario.effective_scale))
        real_s += link.serialisation_s(step.alltoalls * step.alltoall_bytes) + 2 * (n - 1) * link.latency_s
    return GroupCollectives(values, real_s, max(0.0, step.collective_s - real_s), alltoall_values)
