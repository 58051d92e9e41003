"""Ring attention inside `kvtransit up`: which requests are prefilled by a ring, and what the model
says their prefill takes.

A share (`ring_share`) of the requests is a long-prompt class: each has a prompt of `ring_prompt` tokens, too long
for one GPU's prefill, and is prefilled by a ring of `ring_ranks` GPUs (the prefill instance's GPU is rank 0, the
other n − 1 are the ring's own processes) joined by `ring_link` (Liu et al., arXiv:2310.01889; docs/reference.md §7).
The prompt is split into n blocks of `ring_prompt / n` tokens, one a rank (sequence parallelism). A ring request's step
runs alone on the instance (its GPU is a rank of the ring for the whole prompt) and has two parts:

- **the rest of the prompt** (projections and MLP): each rank computes its block's tokens through every weight,
  2·P FLOPs a token, streaming all the weights once (every rank holds them: the ring splits the sequence, not the
  model), plus its block's activations and KV written (docs/reference.md §3's prefill terms at t = ring_prompt / n
  tokens), on the roofline of model/cost/roofline.py; held by the prefill, the step's overhead once;
- **the attention**: per layer, every rank computes blockwise attention on the block it holds while passing that
  block on round the ring, n steps a layer, n − 1 of them a hop (flows/ring/model.py: `hop`, `layer_s`): run live by the
  ring's ranks over the shaped ring link, each hop's time measured, the blocks real bytes at the run's scale.

The first token comes when both are done; the request's KV (all `ring_prompt` tokens) is then handed off like any
other's (decode holds a whole context; a ring only splits the prefill's compute). `prompt_model_s` is what the
run's measured ring prompts are judged against (model/judge/fidelity.py: model_gap).

Which requests are ring requests is a pure function of the seed and the request id (`in_ring_class`), so the load
generator (which gives them their prompt), the prefill and the report agree without telling each other.

Pure: stdlib only.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from kvtransit.flows.ring.model import Hop, hop, hops_per_layer
from kvtransit.model.catalog.devices import Device
from kvtransit.model.catalog.links import Link
from kvtransit.model.catalog.models import ModelSpec
from kvtransit.model.cost.roofline import STEP_OVERHEAD_S, StepWork, step_time
from kvtransit.model.sections import StepExtra
from kvtransit.model.serving.request_class import in_class
from kvtransit.model.serving.workload import RequestSpec

# The ring class's draw is its own: a request's membership of the remote-KV class says nothing of this one.
RING_CLASS_SALT = 0x52494E47  # "RING"
# Ring sizes this emulation starts (docs/reference.md §7's n = 2, 4, 8; each rank past the first is a process).
RING_RANKS = (2, 4, 8)


def in_ring_class(seed: int, request_id: int, share: float) -> bool:
    """Whether request `request_id` of a run seeded `seed` is prefilled by the ring (a fraction `share` of ids)."""
    return share > 0 and in_class(seed, request_id, share, RING_CLASS_SALT)


@dataclass(frozen=True)
class RingPrefill(StepExtra):
    """What the model says one ring request's prefill takes, model seconds (the module docstring); a ring request's
    planned step carries it for the ring's ranks to run (its attention's part)."""

    FLOW: ClassVar[str] = "ring"

    n: int
    prompt_tokens: int
    layers: int
    hop: Hop  # one overlapped hop of a block (its own block's first step is the compute alone)
    rest_s: float  # projections and MLP of one rank's block, roofline, held by the prefill

    @property
    def block_tokens(self) -> int:
        return self.prompt_tokens // self.n

    @property
    def hops_per_layer(self) -> int:
        return hops_per_layer(self.n)

    @property
    def attention_s(self) -> float:
        """The ring's part: L layers of the own block's compute, then n − 1 overlapped hops."""
        return self.layers * (self.hop.compute_s + self.hops_per_layer * self.hop.total_s)

    @property
    def total_s(self) -> float:
        return self.rest_s + self.attention_s + STEP_OVERHEAD_S


def rest_of_prompt_s(model: ModelSpec, device: Device, block_tokens: int) -> float:
    """One rank's projections and MLP over its block (module docstring): 2·P FLOPs a token; every weight streamed
    once, the block's activations (2·t·d values) and its KV written (docs/reference.md §3, without attention's
    FLOPs)."""
    flops = 2 * model.matmul_params * block_tokens
    nbytes = (model.weights_streamed_bytes + model.bytes_per_value * block_tokens * model.d_model
              + block_tokens * model.kv_bytes_per_token)
    cost = step_time(StepWork(float(flops), float(nbytes)), device, 1)
    return max(cost.compute_s, cost.memory_s)


def ring_prefill(model: ModelSpec, device: Device, link: Link, n: int, prompt_tokens: int) -> RingPrefill:
    """The model of a ring request's prefill: `prompt_tokens` split over `n` ranks joined by `link`."""
    block = prompt_tokens // n
    return RingPrefill(n, prompt_tokens, model.layers, hop(model, device, link, block),
                       rest_of_prompt_s(model, device, block))


def with_ring_prompts(specs: list[RequestSpec], seed: int, share: float, prompt_tokens: int) -> list[RequestSpec]:
    """The workload's requests (model/serving/workload.py: RequestSpec), each of the ring class given its
    `prompt_tokens` (its arrival and output kept): the load generator sends what the prefill will ring."""
    if share <= 0:
        return specs
    return [replace(spec, prompt_tokens=prompt_tokens) if in_ring_class(seed, spec.request_id, share) else spec
            for spec in specs]
