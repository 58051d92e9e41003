"""One decode step, planned before it is held (REFERENCE §3-§4; the I/O is agents/decode/agent.py).

The batch is what `DecodeBatcher.admit` left running (model/serving/policies.py); `admitted_prompts` are the prompt
lengths of the requests admitted at this step's boundary. For them the plan says how long the step holds and
what it costs:

- **time**: the roofline decode of the running batch (`decode_step_s`), plus, when the codec ran on the prefill
  GPU (`compress_at="gpu"`), the inverse of every request admitted at this boundary
  (`Scenario.gpu_codec_inverse_s`: decode's GPU restores the full-size KV before the request's first decode
  step, fused into that step with no overhead of its own; a documented model, issue 14); held on the wall
  clock × dilation;
- **energy**: the step's GPU energy (`step_energy_j` of `decode_work`) plus, with the codec on the GPU, the
  inverse's work (`Scenario.gpu_codec_inverse_work`), by the same rule as the prefill's codec
  (model/serving/prefill_plan.py).

With `decode_tp` = n > 1 the instance is a TP group (issue 17 part 4, flows/tp/model.py): the roofline runs on n
GPUs and the step adds its 2·L all-reduces of the batch's activations over the scale-up link, ring or switch, not
overlapped (REFERENCE §7); with `decode_ep` (a MoE model, EP = TP = n) L all-reduces and L dispatch + combine
all-to-alls, the busiest rank's experts touched. What the live group carries for real and what it holds is
`flows/tp/group_step.py`'s.

With the codec in the module (`compress_at="transit"`) the far end's inverse is the second module's, charged
by the middlebox (agents/middlebox/stages/module.py), not here. The live decode and any simulation of decode
plan their steps here, so the two cannot charge the inverse differently.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvtransit.flows.tp.group_step import GroupCollectives, live_collectives
from kvtransit.flows.tp.model import tp_decode_step
from kvtransit.model.cost.roofline import decode_step_s, decode_work, step_energy_j
from kvtransit.model.scenario import Scenario
from kvtransit.model.serving.prefill_plan import codec_on_gpu


@dataclass(frozen=True)
class DecodeStepPlan:
    model_s: float  # modelled step time, the GPU codec's inverse and the TP group's all-reduces included
    wall_s: float  # as held: model_s × dilation
    energy_j: float  # GPU energy of the step, the inverse's included
    inverse_s: float  # of model_s, the inverse of the requests admitted at this boundary (0 without)
    collective_s: float = 0.0  # of model_s, the TP group's all-reduces (0 without a group)
    group: GroupCollectives | None = None  # what the live group carries (decode_tp > 1)

    @property
    def compute_s(self) -> float:
        """The part held before the all-reduces: the shard's roofline and the inverse."""
        return self.model_s - self.collective_s


def plan_decode_step(scenario: Scenario, batch: int, context_tokens: int,
                     admitted_prompts: Sequence[int] = ()) -> DecodeStepPlan:
    """The plan of a step over `batch` running sequences (≥ 1) attending to `context_tokens` in all, having
    admitted requests with `admitted_prompts` prompt tokens at its boundary."""
    model, device = scenario.model_spec, scenario.device_spec
    inverse_s = sum(scenario.gpu_codec_inverse_s(p) for p in admitted_prompts)
    energy_j = step_energy_j(device, decode_work(model, batch, context_tokens))
    if codec_on_gpu(scenario):
        energy_j += sum(step_energy_j(device, scenario.gpu_codec_inverse_work(p)) for p in admitted_prompts)
    if scenario.decode_tp == 1:
        model_s = decode_step_s(model, device, scenario.gpus, batch, context_tokens) + inverse_s
        return DecodeStepPlan(model_s, scenario.wall_s(model_s), energy_j, inverse_s)
    step = tp_decode_step(model, device, scenario.scaleup_link_spec, tp=scenario.decode_tp,
                          ep=scenario.decode_tp if scenario.decode_ep else 0, batch=batch, context_total=context_tokens,
                          allreduce=scenario.allreduce, module=scenario.module)
    model_s = step.total_s + inverse_s
    return DecodeStepPlan(model_s, scenario.wall_s(model_s), energy_j, inverse_s, step.collective_s,
                          live_collectives(scenario, scenario.decode_tp, step))
