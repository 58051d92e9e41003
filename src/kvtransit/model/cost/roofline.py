"""The GPU roofline cost model of the simulator (docs/reference.md §3): how long a prefill or decode step holds.

`t_step = max(FLOPs / (peak × 0.55 × n_gpus), bytes / (hbm_bw × 0.80 × n_gpus)) + 0.5 ms`
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from kvtransit.model.catalog.devices import Device
from kvtransit.model.catalog.models import ModelSpec
from kvtransit.model.cost.energy import gpu_energy_j
from kvtransit.model.errors import ConfigError

# docs/reference.md §3: achieved fraction of peak FLOP/s and of HBM bandwidth, and the fixed per-step overhead.
FLOPS_EFFICIENCY = 0.55
HBM_EFFICIENCY = 0.80
STEP_OVERHEAD_S = 0.5e-3
# docs/reference.md §3: the share of HBM usable for weights and KV.
HBM_USABLE_FRACTION = 0.9


@dataclass(frozen=True)
class StepWork:
    """What one step asks of the GPUs: FLOPs and HBM bytes moved."""

    flops: float
    hbm_bytes: float


@dataclass(frozen=True)
class StepTime:
    compute_s: float  # FLOPs / (peak × 0.55 × n)
    memory_s: float  # bytes / (hbm × 0.80 × n)
    overhead_s: float = STEP_OVERHEAD_S

    @property
    def total_s(self) -> float:
        return max(self.compute_s, self.memory_s) + self.overhead_s

    @property
    def bound(self) -> str:
        return "compute" if self.compute_s > self.memory_s else "memory"


def _require_count(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    return value


def prefill_work(model: ModelSpec, prompt_lens: Sequence[int]) -> StepWork:
    """Prompts s_i, T = Σ s_i: FLOPs = 2·P·T + Σ 2·L·d·s_i·(s_i+1);
    bytes = weights_streamed + 2·T·d + T·kv_bytes_per_token (docs/reference.md §3)."""
    if not prompt_lens:
        raise ConfigError("a prefill step needs at least one prompt")
    for s in prompt_lens:
        _require_count("prompt length", s)
    total = sum(prompt_lens)
    L, d = model.layers, model.d_model
    flops = 2 * model.matmul_params * total + sum(2 * L * d * s * (s + 1) for s in prompt_lens)
    nbytes = model.weights_streamed_bytes + model.bytes_per_value * total * d + total * model.kv_bytes_per_token
    return StepWork(float(flops), float(nbytes))


def decode_work(model: ModelSpec, batch: int, context_tokens: int) -> StepWork:
    """Batch b, ctx = Σ(prompt + tokens so far) over the batch: FLOPs = 2·P·b + 4·L·d·(ctx + b);
    bytes = weights_streamed + 2·b·d + (ctx + b)·kv_bytes_per_token (docs/reference.md §3)."""
    _require_count("decode batch", batch)
    if isinstance(context_tokens, bool) or not isinstance(context_tokens, int) or context_tokens < 0:
        raise ConfigError(f"context tokens must be an integer >= 0, got {context_tokens!r}")
    L, d = model.layers, model.d_model
    attended = context_tokens + batch  # every sequence also attends to the token it is producing
    flops = 2 * model.matmul_params * batch + 4 * L * d * attended
    nbytes = model.weights_streamed_bytes + model.bytes_per_value * batch * d + attended * model.kv_bytes_per_token
    return StepWork(float(flops), float(nbytes))


def step_time(work: StepWork, device: Device, n_gpus: int) -> StepTime:
    _require_count("number of GPUs", n_gpus)
    return StepTime(
        compute_s=work.flops / (device.peak_flops * FLOPS_EFFICIENCY * n_gpus),
        memory_s=work.hbm_bytes / (device.hbm_Bps * HBM_EFFICIENCY * n_gpus),
    )


def prefill_step_s(model: ModelSpec, device: Device, n_gpus: int, prompt_lens: Sequence[int]) -> float:
    return step_time(prefill_work(model, prompt_lens), device, n_gpus).total_s


def decode_step_s(model: ModelSpec, device: Device, n_gpus: int, batch: int, context_tokens: int) -> float:
    """`context_tokens` is the batch total: Σ(prompt + tokens so far), not a per-sequence figure."""
    return step_time(decode_work(model, batch, context_tokens), device, n_gpus).total_s


def kv_capacity_tokens(model: ModelSpec, device: Device, n_gpus: int) -> int:
    """⌊(hbm × n × 0.9 − resident_weights) / kv_bytes_per_token⌋ (docs/reference.md §3); 0 if weights do not fit."""
    _require_count("number of GPUs", n_gpus)
    free = device.hbm_bytes * n_gpus * HBM_USABLE_FRACTION - model.resident_weight_bytes
    return max(0, math.floor(free / model.kv_bytes_per_token))


def step_energy_j(device: Device, work: StepWork) -> float:
    """GPU energy of one step: FLOPs × pJ/FLOP + HBM bytes × pJ/byte (whole step, all GPUs)."""
    return gpu_energy_j(device, work.flops, work.hbm_bytes)


def prefill_work_cached(model: ModelSpec, prompts: Sequence[tuple[int, int]]) -> StepWork:
    """Prefill with a cached prefix: prompts (s_i, c_i), c_i of the s_i tokens already held as KV.

    docs/reference.md §3's prefill with the cached tokens' KV re-read, not recomputed. Only the n_i = s_i - c_i new
    tokens go through the matmuls and write KV; each new token at position p attends to all p tokens before
    it and itself, so attention FLOPs are Σ_{p=c+1..s} 4·L·d·p = 2·L·d·(s(s+1) − c(c+1)) (which is the full
    prefill's 2·L·d·s(s+1) at c = 0); bytes = weights_streamed + 2·N·d + N·kv_bytes_per_token (new KV
    written) + C·kv_bytes_per_token (cached KV read), N = Σ n_i, C = Σ c_i. At c_i = 0 it equals
    `prefill_work`.
    """
    if not prompts:
        raise ConfigError("a prefill step needs at least one prompt")
    for s, c in prompts:
        _require_count("prompt length", s)
        if isinstance(c, bool) or not isinstance(c, int) or not 0 <= c < s:
            raise ConfigError(f"cached tokens must be an integer in [0, prompt length {s}), got {c!r}")
    new = sum(s - c for s, c in prompts)
    cached = sum(c for _, c in prompts)
    L, d = model.layers, model.d_model
    flops = 2 * model.matmul_params * new + sum(2 * L * d * (s * (s + 1) - c * (c + 1)) for s, c in prompts)
    nbytes = (model.weights_streamed_bytes + model.bytes_per_value * new * d
              + (new + cached) * model.kv_bytes_per_token)
    return StepWork(float(flops), float(nbytes))


def prefill_step_cached_s(model: ModelSpec, device: Device, n_gpus: int, prompts: Sequence[tuple[int, int]]) -> float:
    """Step time of a prefill batch whose prompts (s_i, c_i) start from c_i cached tokens."""
    return step_time(prefill_work_cached(model, prompts), device, n_gpus).total_s
