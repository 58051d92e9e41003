"""One prefill step, planned before it is held (REFERENCE §3-§4; the I/O is agents/prefill/agent.py).

The batch is what `PrefillQueue.take_batch` gave (model/serving.py). For it the plan says how long the step
holds and what it costs:

- **time**: the roofline prefill of the batch, each prompt starting from the tokens its prefix lookup found
  cached (`prefill_step_cached_s`: the cached KV is re-read, not recomputed; with nothing cached it is exactly
  `prefill_step_s`), plus, when the codec runs on the prefill GPU (`compress_at="gpu"`), the codec's GPU time
  of every request (`Scenario.gpu_codec_s`); held on the wall clock × dilation;
- **energy**: the step's GPU energy (`step_energy_j`) plus, with the codec on the GPU, the codec's work
  (`Scenario.gpu_codec_work`);
- **hand-offs**: which requests go on to decode (output > 1 token) and which are done at their first token,
  as in the simulator.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from .cost import prefill_step_cached_s, prefill_work_cached, step_energy_j
from .scenario import Scenario


@dataclass(frozen=True)
class BatchEntry:
    """One request of the batch, as the step sees it."""

    request_id: Hashable
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int = 0  # of the prompt, found cached by its prefix lookup (0 without prefix reuse)

    @property
    def hands_off(self) -> bool:
        """Its KV goes on to decode; with a single output token the request is done at its first token."""
        return self.output_tokens > 1


@dataclass(frozen=True)
class PrefillStepPlan:
    entries: tuple[BatchEntry, ...]
    model_s: float  # modelled step time, the GPU codec's included
    wall_s: float  # as held: model_s × dilation
    energy_j: float  # GPU energy of the step, the GPU codec's included

    @property
    def handoffs(self) -> tuple[BatchEntry, ...]:
        return tuple(e for e in self.entries if e.hands_off)

    @property
    def done_at_prefill(self) -> tuple[BatchEntry, ...]:
        return tuple(e for e in self.entries if not e.hands_off)


def codec_on_gpu(scenario: Scenario) -> bool:
    """Whether the prefill GPU runs the codec (the all-GPU baseline): `compress_at="gpu"` with a real codec."""
    return scenario.compress_at == "gpu" and scenario.codec != "none"


def plan_prefill_step(scenario: Scenario, entries: Sequence[BatchEntry]) -> PrefillStepPlan:
    """The plan of a step over `entries` (at least one); the module docstring says what goes in."""
    model, device = scenario.model_spec, scenario.device_spec
    prompts = [(e.prompt_tokens, e.cached_tokens) for e in entries]
    model_s = prefill_step_cached_s(model, device, scenario.gpus, prompts)
    model_s += sum(scenario.gpu_codec_s(e.prompt_tokens) for e in entries)
    energy_j = step_energy_j(device, prefill_work_cached(model, prompts))
    if codec_on_gpu(scenario):
        energy_j += sum(step_energy_j(device, scenario.gpu_codec_work(e.prompt_tokens)) for e in entries)
    return PrefillStepPlan(tuple(entries), model_s, scenario.wall_s(model_s), energy_j)
