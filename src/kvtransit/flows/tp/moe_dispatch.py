"""FP8 dispatch on the MoE all-to-all: what the dispatch carries, where its codec may run, and
what running it at the GPU costs.

An EP group's all-to-all is a dispatch (each token's activations to its experts' ranks) and a combine (the
experts' outputs back), docs/reference.md §7. The usual compression is FP8 on the dispatch only (the combine stays BF16,
as DeepSeek-V3 trains and serves it): the dispatch's bytes halve, so one layer's all-to-all carries
`tokens · k · d · (n−1)/n · (1.0625 + 2)` bytes instead of `… · (2 + 2)` (an E4M3 byte a value and a float32
scale per 64 values, as kernels/quant.py's fp8 sends them).

FP8 needs rounding, which the module's published op set lacks (docs/reference.md §5; `module.UNPUBLISHED_OPS`), so in
transit it is judged like any kernel (`module.budget_check`): refused under `--policy reject`, moved to the GPU
under `--policy host`. At the GPU the cast is fused into the layer (no step overhead of its own): each rank casts
down what it dispatches and casts back up what it receives, one op per value each way (the fp8 preset's
"1 op per value", model/catalog/codecs.py), streaming BF16 and FP8 through HBM once each way (`gpu_codec.fused_s`).

Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvtransit.model.catalog.codecs import FP8_OPS_PER_VALUE, codec_declaration
from kvtransit.model.catalog.devices import Device
from kvtransit.model.catalog.models import ModelSpec
from kvtransit.model.cost.gpu_codec import fused_s
from kvtransit.model.cost.roofline import StepWork
from kvtransit.model.errors import ConfigError
from kvtransit.model.module.budget import Action, BudgetResult, Module, Policy, Verdict, budget_check

DISPATCH_BF16 = "bf16"
DISPATCH_FP8 = "fp8"
# The fp8 kernel's block: one float32 scale per 64 values (kernels/quant.py: DEFAULT_FP8_BLOCK; model may not
# import kernels, and a unit test holds the two equal).
FP8_BLOCK = 64
# What one dispatched value takes on the wire: BF16 2 B (docs/reference.md §1); FP8 an E4M3 byte plus its share of the
# block's 4-byte scale, as the kernel the ranks run sends it.
DISPATCH_VALUE_BYTES = {DISPATCH_BF16: 2.0, DISPATCH_FP8: 1.0 + 4.0 / FP8_BLOCK}
AT_GPU = "gpu"
AT_TRANSIT = "transit"
DISPATCH_PLACES = (AT_GPU, AT_TRANSIT)
# E4M3 keeps 3 mantissa bits: a rounded normal value is within half an ulp, 2^-4 of itself (OCP 8-bit floating point
# spec). What the ranks check each decoded dispatch chunk against, and what the real-model error is reported beside.
E4M3_HALF_ULP = 2.0 ** -4


@dataclass(frozen=True)
class DispatchPlacement:
    """Where the dispatch's codec runs, and why there."""

    codec: str  # bf16 (no codec) | fp8
    asked_at: str  # gpu | transit
    runs_at: str  # gpu | transit | "-" (nothing to run)
    why: str
    budget: BudgetResult | None = None  # the module's judgement, when it was asked

    @property
    def value_bytes(self) -> float:
        return DISPATCH_VALUE_BYTES[self.codec]

    def to_json(self) -> dict[str, object]:
        return {"codec": self.codec, "asked_at": self.asked_at, "runs_at": self.runs_at, "why": self.why,
                "module_verdict": self.budget.describe() if self.budget is not None else None}


def place_dispatch(codec: str, at: str = AT_GPU, module: Module = Module(),
                   policy: Policy = Policy.REJECT) -> DispatchPlacement:
    """Where `codec` runs when asked to run `at` the GPU or in transit; a refusal is a one-line ConfigError."""
    if codec not in DISPATCH_VALUE_BYTES:
        raise ConfigError(f"unknown dispatch codec {codec!r} (choose from: {', '.join(DISPATCH_VALUE_BYTES)})")
    if at not in DISPATCH_PLACES:
        raise ConfigError(f"unknown dispatch placement {at!r} (choose from: {', '.join(DISPATCH_PLACES)})")
    if codec == DISPATCH_BF16:
        return BF16_DISPATCH if at == AT_GPU else DispatchPlacement(codec, at, "-", BF16_DISPATCH.why)
    if at == AT_GPU:
        return DispatchPlacement(codec, at, AT_GPU, "at the GPU: rounding is a GPU operation, fused into the layer")
    result = budget_check(codec_declaration(DISPATCH_FP8), module, policy)
    if result.verdict is Verdict.NOT_ALLOWED and result.action is Action.REJECTED:
        needs = ", ".join(sorted(result.unpublished_ops))
        raise ConfigError(f"FP8 dispatch refused in transit: it needs {needs}, which the module ({module.name}) "
                          "does not publish (docs/reference.md §5); run it at the GPU (--dispatch-at gpu) or let the "
                          "policy move it there (--policy host)")
    if result.action is Action.ON_HOST:
        return DispatchPlacement(codec, at, AT_GPU, f"moved to the GPU by --policy host: {result.describe()}",
                                 result)
    return DispatchPlacement(codec, at, AT_TRANSIT, f"in the module: {result.describe()}", result)


# The dispatch when nothing is said: BF16, no codec.
BF16_DISPATCH = DispatchPlacement(DISPATCH_BF16, AT_GPU, "-", "BF16 dispatch: no codec")


def dispatched_values(model: ModelSpec, tokens: int, n: int) -> float:
    """Values one rank dispatches (and receives) in one MoE layer: `tokens · k · d · (n−1)/n` (docs/reference.md §7)."""
    return tokens * model.experts_active * model.d_model * (n - 1) / n


def gpu_cast_work(model: ModelSpec, tokens: int, n: int) -> StepWork:
    """One rank's FP8 casts in one MoE layer: down before the dispatch, up after it, one op per value each way;
    HBM reads BF16 and writes FP8, then reads FP8 and writes BF16."""
    values = dispatched_values(model, tokens, n)
    moved = values * (DISPATCH_VALUE_BYTES[DISPATCH_BF16] + DISPATCH_VALUE_BYTES[DISPATCH_FP8])
    return StepWork(2.0 * FP8_OPS_PER_VALUE * values, 2.0 * moved)


def gpu_cast_s(model: ModelSpec, device: Device, tokens: int, n: int) -> float:
    """The roofline time of one rank's casts in one MoE layer, fused into it (one GPU a rank)."""
    return fused_s(gpu_cast_work(model, tokens, n), device, 1)
