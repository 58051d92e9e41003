"""Tensor- and expert-parallel collectives, first order (docs/reference.md §7): how long a TP all-reduce or a MoE
all-to-all holds a step, and what share of the step the collectives are.

- TP all-reduce, two per layer (after attention and after the MLP) of the activations S = tokens × d × 2 B:
  ring over the scale-up link `2(n−1)/n · S/B + 2(n−1) · latency`; in the network (a switch that sums) one hop
  up `latency + S/B`, the switch's sum, one hop down `latency + S/B`.
- MoE all-to-all (EP = n), per MoE layer a dispatch and a combine: `2 · tokens · k · d · (n−1)/n` values × 2 B
  over the link plus `2(n−1) · latency` (FP8 dispatch, flows/tp/moe_dispatch.py: the dispatch's half at ~1 B a
  value, the GPU's casts fused into the layer); experts touched `E · (1 − (1 − k/E)^tokens)`; the busiest rank's expert
  FLOPs × `expert_imbalance`.
- The step: roofline compute on n GPUs (docs/reference.md §3, `cost.step_time`) + the collectives, not overlapped.
  Dense TP: 2·L all-reduces. EP = TP = n: the attention's all-reduce stays (L of them) and the MLP's becomes
  the dispatch + combine (L all-to-alls).

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvtransit.flows.tp.moe_dispatch import (
    AT_GPU,
    BF16_DISPATCH,
    DISPATCH_BF16,
    DISPATCH_VALUE_BYTES,
    DispatchPlacement,
    gpu_cast_s,
)
from kvtransit.model.catalog.devices import Device
from kvtransit.model.catalog.links import Link
from kvtransit.model.catalog.models import ModelSpec
from kvtransit.model.cost.roofline import StepTime, StepWork, decode_work, prefill_work, step_time
from kvtransit.model.errors import ConfigError
from kvtransit.model.module.budget import Module

# docs/reference.md §7: two all-reduces per layer, after attention and after the MLP.
ALLREDUCES_PER_LAYER = 2
# docs/reference.md §5: "summing two streams (all-reduce) = 0.50 op/byte (needs a switch)". The same figure as
# kernels/stream_sum.py's declaration (model may not import kernels; a unit test holds the two equal).
SUM_OPS_PER_BYTE = 0.50
# SwiGLU: gate, up and down projections per expert (docs/reference.md §3's 3·d·d_ff).
MLP_MATRICES = 3

ALLREDUCE_RING = "ring"
ALLREDUCE_SWITCH = "switch"
ALLREDUCE_KINDS = (ALLREDUCE_RING, ALLREDUCE_SWITCH)


def _require_group(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"group size must be a positive integer, got {n!r}")
    return n


def _require_bytes(nbytes: float) -> float:
    if not nbytes >= 0:
        raise ConfigError(f"bytes must be >= 0, got {nbytes!r}")
    return nbytes


def _require_tokens(tokens: int) -> int:
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise ConfigError(f"tokens must be a positive integer, got {tokens!r}")
    return tokens


def activation_bytes(model: ModelSpec, tokens: int) -> int:
    """S = tokens × d_model × 2 B: what one all-reduce sums (docs/reference.md §7)."""
    return _require_tokens(tokens) * model.d_model * model.bytes_per_value


def ring_allreduce_s(nbytes: float, n: int, link: Link) -> float:
    """`2(n−1)/n · S/B + 2(n−1) · latency` (docs/reference.md §7): reduce-scatter then all-gather, n−1 hops each,
    S/n bytes a hop. One rank alone reduces nothing: 0."""
    _require_group(n)
    _require_bytes(nbytes)
    hops = 2 * (n - 1)
    return hops / n * nbytes / link.bandwidth_Bps + hops * link.latency_s


@dataclass(frozen=True)
class SwitchAllReduce:
    """The in-network all-reduce's parts: every rank sends S up, the switch sums the n streams, S comes down."""

    up_s: float  # latency + S/B
    sum_s: float  # the module's added latency + 0.50 op/B × S at the module's ops per line byte × B
    down_s: float  # latency + S/B

    @property
    def total_s(self) -> float:
        return self.up_s + self.sum_s + self.down_s


def switch_sum_s(nbytes: float, link: Link, module: Module = Module()) -> float:
    """The switch's sum of one S-byte stream per port: docs/reference.md §5's module arithmetic, 0.50 op per input
    byte against `module.ops_per_byte` ops per line byte at the port's rate B, plus the module's added latency
    (its 1 µs). Held after the last stream arrived, not overlapped with the hops (a first-order bound: the
    sum of a byte needs that byte from every rank)."""
    _require_bytes(nbytes)
    return module.added_latency_s + SUM_OPS_PER_BYTE * nbytes / (module.ops_per_byte * link.bandwidth_Bps)


def switch_allreduce(nbytes: float, n: int, link: Link, module: Module = Module()) -> SwitchAllReduce:
    """One hop up, the sum, one hop down (docs/reference.md §7, "in the network"). One rank alone: 0."""
    _require_group(n)
    _require_bytes(nbytes)
    if n == 1:
        return SwitchAllReduce(0.0, 0.0, 0.0)
    hop = link.transfer_time_s(nbytes)
    return SwitchAllReduce(up_s=hop, sum_s=switch_sum_s(nbytes, link, module), down_s=hop)


def allreduce_s(kind: str, nbytes: float, n: int, link: Link, module: Module = Module()) -> float:
    if kind == ALLREDUCE_RING:
        return ring_allreduce_s(nbytes, n, link)
    if kind == ALLREDUCE_SWITCH:
        return switch_allreduce(nbytes, n, link, module).total_s
    raise ConfigError(f"unknown all-reduce {kind!r} (choose from: {', '.join(ALLREDUCE_KINDS)})")


# --- MoE -----------------------------------------------------------------------------------------------------
def _require_moe(model: ModelSpec) -> None:
    if model.experts < 2:
        raise ConfigError(f"expert parallelism needs a mixture-of-experts model; {model.name} is dense "
                          f"(experts = {model.experts})")


def alltoall_bytes(model: ModelSpec, tokens: int, n: int, dispatch: str = DISPATCH_BF16) -> float:
    """One MoE layer's dispatch + combine: `2 · tokens · k · d · (n−1)/n` activations × 2 B (docs/reference.md §7); with
    FP8 dispatch the dispatch's half is the fp8 kernel's 1.0625 B a value (the combine stays BF16)."""
    _require_moe(model)
    _require_group(n)
    _require_tokens(tokens)
    each_way = tokens * model.experts_active * model.d_model * (n - 1) / n
    return each_way * (DISPATCH_VALUE_BYTES[dispatch] + model.bytes_per_value)


def alltoall_s(model: ModelSpec, tokens: int, n: int, link: Link, dispatch: str = DISPATCH_BF16) -> float:
    """`bytes / B + 2(n−1) · latency` for one MoE layer's dispatch + combine (docs/reference.md §7)."""
    return link.serialisation_s(alltoall_bytes(model, tokens, n, dispatch)) + 2 * (n - 1) * link.latency_s


def experts_touched(experts: int, active: int, tokens: int) -> float:
    """`E · (1 − (1 − k/E)^tokens)`: the expected experts a layer reads weights for (docs/reference.md §7)."""
    if isinstance(experts, bool) or not isinstance(experts, int) or experts < 1:
        raise ConfigError(f"experts must be a positive integer, got {experts!r}")
    if isinstance(active, bool) or not isinstance(active, int) or not 1 <= active <= experts:
        raise ConfigError(f"active experts must be an integer in 1..{experts}, got {active!r}")
    _require_tokens(tokens)
    return experts * (1 - (1 - active / experts) ** tokens)


def moe_work(model: ModelSpec, work: StepWork, tokens: int, expert_imbalance: float = 1.0) -> StepWork:
    """docs/reference.md §3's step `work` (which counts k active experts a token) made MoE-aware (docs/reference.md §7):
    expert weights streamed for the experts touched, not k; the expert FLOPs × `expert_imbalance`, since the
    step waits for the busiest rank (its share of the expert FLOPs is imbalance × the mean)."""
    _require_moe(model)
    if not expert_imbalance >= 1:
        raise ConfigError(f"expert_imbalance must be >= 1 (the busiest rank over the mean), got {expert_imbalance!r}")
    expert_params = model.layers * MLP_MATRICES * model.d_model * model.d_ff  # one expert, every layer
    touched = experts_touched(model.experts, model.experts_active, tokens)
    extra_bytes = (touched - model.experts_active) * expert_params * model.bytes_per_value
    expert_flops = 2 * expert_params * model.experts_active * tokens
    return StepWork(flops=work.flops + (expert_imbalance - 1) * expert_flops,
                    hbm_bytes=work.hbm_bytes + extra_bytes)


# --- a parallel step -----------------------------------------------------------------------------------------
def valid_tp_sizes(model: ModelSpec) -> list[int]:
    """TP sizes that split the attention heads evenly: the divisors of the model's heads."""
    return [n for n in range(1, model.n_heads + 1) if model.n_heads % n == 0]


def valid_ep_sizes(model: ModelSpec) -> list[int]:
    """EP (= TP) sizes that split both the experts and the heads evenly."""
    return [n for n in valid_tp_sizes(model) if model.experts % n == 0] if model.experts > 1 else []


def check_tp(model: ModelSpec, n: int) -> int:
    _require_group(n)
    if model.n_heads % n:
        valid = ", ".join(map(str, valid_tp_sizes(model)))
        raise ConfigError(f"TP {n} does not divide {model.name}'s {model.n_heads} heads (valid: {valid})")
    return n


def check_ep(model: ModelSpec, n: int) -> int:
    _require_group(n)
    if model.experts < 2:
        raise ConfigError(f"EP needs a mixture-of-experts model; {model.name} is dense "
                          f"(use --tp, or a model with experts: mixtral-8x7b)")
    if n not in valid_ep_sizes(model):
        valid = ", ".join(map(str, valid_ep_sizes(model)))
        raise ConfigError(f"EP {n} does not divide {model.name}'s {model.experts} experts and {model.n_heads} heads "
                          f"(valid: {valid})")
    return n


@dataclass(frozen=True)
class ParallelStep:
    """One step of a TP-n (or EP=TP=n) group: compute, then the collectives, not overlapped (docs/reference.md §7)."""

    n: int
    compute: StepTime  # roofline on n GPUs, with its 0.5 ms overhead
    allreduce_kind: str
    allreduce_bytes: int  # S, one all-reduce
    allreduces: int  # how many a step: 2·L dense, L with EP
    allreduce_each_s: float
    alltoalls: int  # MoE layers' dispatch + combine: L with EP, else 0
    alltoall_bytes: float  # one layer's dispatch + combine
    alltoall_each_s: float
    dispatch: DispatchPlacement = BF16_DISPATCH
    cast_each_s: float = 0.0  # FP8 dispatch at the GPU: one layer's casts (moe_dispatch.gpu_cast_s)

    @property
    def compute_s(self) -> float:
        return self.compute.total_s

    @property
    def allreduce_s(self) -> float:
        return self.allreduces * self.allreduce_each_s

    @property
    def alltoall_s(self) -> float:
        return self.alltoalls * self.alltoall_each_s

    @property
    def collective_s(self) -> float:
        return self.allreduce_s + self.alltoall_s

    @property
    def cast_s(self) -> float:
        """The GPU's FP8 casts of every MoE layer in the step (0 without FP8 dispatch at the GPU)."""
        return self.alltoalls * self.cast_each_s

    @property
    def total_s(self) -> float:
        return self.compute_s + self.cast_s + self.collective_s

    def share(self, seconds: float) -> float:
        return seconds / self.total_s

    @property
    def collective_share(self) -> float:
        return self.share(self.collective_s)


def parallel_step(model: ModelSpec, device: Device, work: StepWork, tokens: int, link: Link, *,
                  tp: int = 1, ep: int = 0, allreduce: str = ALLREDUCE_RING, module: Module = Module(),
                  expert_imbalance: float = 1.0, dispatch: DispatchPlacement | None = None) -> ParallelStep:
    """A step of `work` (`tokens` tokens of activations through every layer) on a TP-`tp` group, or with
    `ep` > 0 an EP = TP = `ep` group of a MoE model. Dense TP: 2·L all-reduces; EP: L all-reduces (attention)
    and L dispatch + combine (the MLP), the dispatch in BF16 or, with `dispatch` (moe_dispatch.place_dispatch),
    in FP8."""
    if allreduce not in ALLREDUCE_KINDS:
        raise ConfigError(f"unknown all-reduce {allreduce!r} (choose from: {', '.join(ALLREDUCE_KINDS)})")
    nbytes = activation_bytes(model, tokens)
    dispatch = dispatch or BF16_DISPATCH
    if ep:
        n = check_ep(model, ep)
        work = moe_work(model, work, tokens, expert_imbalance)
        cast_each_s = gpu_cast_s(model, device, tokens, n) if dispatch.runs_at == AT_GPU else 0.0
        return ParallelStep(n, step_time(work, device, n), allreduce, nbytes, model.layers,
                            allreduce_s(allreduce, nbytes, n, link, module), model.layers,
                            alltoall_bytes(model, tokens, n, dispatch.codec),
                            alltoall_s(model, tokens, n, link, dispatch.codec), dispatch, cast_each_s)
    if dispatch.codec != DISPATCH_BF16:
        raise ConfigError(f"a {dispatch.codec.upper()} dispatch needs an all-to-all: expert parallelism (--ep)")
    # TP of a MoE model without EP: every expert split n ways, the step as docs/reference.md §3 has it (k a token).
    n = check_tp(model, tp)
    return ParallelStep(n, step_time(work, device, n), allreduce, nbytes, ALLREDUCES_PER_LAYER * model.layers,
                        allreduce_s(allreduce, nbytes, n, link, module), 0, 0.0, 0.0)


def tp_decode_step(model: ModelSpec, device: Device, link: Link, *, tp: int = 1, ep: int = 0, batch: int = 1,
                   context_total: int = 0, allreduce: str = ALLREDUCE_RING, module: Module = Module(),
                   expert_imbalance: float = 1.0, dispatch: DispatchPlacement | None = None) -> ParallelStep:
    """A decode step of `batch` sequences (one token each) on a parallel group."""
    return parallel_step(model, device, decode_work(model, batch, context_total), batch, link, tp=tp, ep=ep,
                         allreduce=allreduce, module=module, expert_imbalance=expert_imbalance, dispatch=dispatch)


def tp_prefill_step(model: ModelSpec, device: Device, link: Link, prompt_lens: Sequence[int], *, tp: int = 1,
                    ep: int = 0, allreduce: str = ALLREDUCE_RING, module: Module = Module(),
                    expert_imbalance: float = 1.0, dispatch: DispatchPlacement | None = None) -> ParallelStep:
    """A prefill step of `prompt_lens` on a parallel group: every prompt token's activations are reduced."""
    return parallel_step(model, device, prefill_work(model, prompt_lens), sum(prompt_lens), link, tp=tp, ep=ep,
                         allreduce=allreduce, module=module, expert_imbalance=expert_imbalance, dispatch=dispatch)
