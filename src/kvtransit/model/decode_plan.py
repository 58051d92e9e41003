"""One decode step, planned before it is held (REFERENCE §3-§4; the I/O is agents/decode/agent.py).

The batch is what `DecodeBatcher.admit` left running (model/serving.py); `admitted_prompts` are the prompt
lengths of the requests admitted at this step's boundary. For them the plan says how long the step holds and
what it costs:

- **time**: the roofline decode of the running batch (`decode_step_s`), plus, when the codec ran on the prefill
  GPU (`compress_at="gpu"`), the inverse of every request admitted at this boundary
  (`Scenario.gpu_codec_inverse_s`: decode's GPU restores the full-size KV before the request's first decode
  step, fused into that step with no overhead of its own; a documented model, issue 14); held on the wall
  clock × dilation;
- **energy**: the step's GPU energy (`step_energy_j` of `decode_work`) plus, with the codec on the GPU, the
  inverse's work (`Scenario.gpu_codec_inverse_work`), by the same rule as the prefill's codec
  (model/prefill_plan.py).

With the codec in the module (`compress_at="transit"`) the far end's inverse is the second module's, charged
by the middlebox (agents/middlebox/stages/module.py), not here. The live decode and any simulation of decode
plan their steps here, so the two cannot charge the inverse differently.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .cost import decode_step_s, decode_work, step_energy_j
from .prefill_plan import codec_on_gpu
from .scenario import Scenario


@dataclass(frozen=True)
class DecodeStepPlan:
    model_s: float  # modelled step time, the GPU codec's inverse included
    wall_s: float  # as held: model_s × dilation
    energy_j: float  # GPU energy of the step, the inverse's included
    inverse_s: float  # of model_s, the inverse of the requests admitted at this boundary (0 without)


def plan_decode_step(scenario: Scenario, batch: int, context_tokens: int,
                     admitted_prompts: Sequence[int] = ()) -> DecodeStepPlan:
    """The plan of a step over `batch` running sequences (≥ 1) attending to `context_tokens` in all, having
    admitted requests with `admitted_prompts` prompt tokens at its boundary."""
    model, device = scenario.model_spec, scenario.device_spec
    inverse_s = sum(scenario.gpu_codec_inverse_s(p) for p in admitted_prompts)
    model_s = decode_step_s(model, device, scenario.gpus, batch, context_tokens) + inverse_s
    energy_j = step_energy_j(device, decode_work(model, batch, context_tokens))
    if codec_on_gpu(scenario):
        energy_j += sum(step_energy_j(device, scenario.gpu_codec_inverse_work(p)) for p in admitted_prompts)
    return DecodeStepPlan(model_s, scenario.wall_s(model_s), energy_j, inverse_s)
