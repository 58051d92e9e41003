"""Which kernel the switch may run, checked before it serves a rank. Sans-IO.

The switch has one implementation, the stream sum (`kernels/stream_sum.py`, summed in blocks by `reducer.py`), so a
declared kernel runs on it only when it *is* that sum, as the switch charges it:
- its placement sees every stream it combines (`model.module.placement_check`, with the process's placement: a
  pluggable sees one stream and is refused a sum whatever the file says);
- it combines exactly the group's streams (a sum merges every rank's part);
- transform none, `float` adds among its op types, ratio n (n streams in, one out), 0.50 op per input byte
  (docs/reference.md §5: "summing two streams = 0.50 op/byte (needs a switch)", what `flows/tp/model.py: switch_sum_s`
  holds), not lossless (a sum does not give back its terms);
- the module accepts it (`budget_check`, policy reject: a sum is in the published set, so only a misplaced or an
  unpublished-op declaration is refused; transit-bound is allowed, and the switch holds that time).
Every refusal is a one-line ConfigError naming the kernel and what to declare instead.
"""

from __future__ import annotations

import math
from dataclasses import replace

from kvtransit.kernels.stream_sum import SUM_OPS_PER_BYTE
from kvtransit.model.errors import ConfigError
from kvtransit.model.module.budget import (
    TRANSFORM_NONE,
    Action,
    BudgetResult,
    KernelDeclaration,
    Module,
    Policy,
    budget_check,
    placement_check,
)

SUM_OP = "float"  # BF16 adds accumulated in float32 (kernels/stream_sum.py)
# Declared numbers agree when equal up to float error in their decimals (as model/module/kernel_runs.py reads a file).
_FLOAT_REL_TOL = 1e-9


def placement_refusal(decl: KernelDeclaration, placement: str) -> str | None:
    """Why a middlebox at `placement` cannot run `decl` (placement_check's reason), or None when it sees every
    stream the kernel combines. `placement` is the process's, not the declaration's."""
    placed = placement_check(replace(decl, placement=placement))
    return None if placed.ok else f"kernel {decl.name!r}: {placed.describe()}"


def check_switch_kernel(decl: KernelDeclaration, size: int, placement: str, module: Module) -> BudgetResult:
    """The module's verdict on `decl` summing a group of `size` on a middlebox at `placement` (see the module
    docstring); ConfigError naming why it cannot run there."""
    where = f"kernel {decl.name!r}"
    refusal = placement_refusal(decl, placement)
    if refusal is not None:
        raise ConfigError(refusal)
    if decl.streams != size:
        raise ConfigError(f"{where} combines {decl.streams} stream{'s' if decl.streams != 1 else ''}, but the switch "
                          f"serves a group of {size}: a sum merges every rank's stream (declare streams = {size})")
    if decl.transform != TRANSFORM_NONE:
        raise ConfigError(f"{where}: transform {decl.transform!r}: the switch runs the stream sum only "
                          f"(transform none, op_types [{SUM_OP!r}], ratio {size}, ops_per_byte {SUM_OPS_PER_BYTE:g})")
    if SUM_OP not in decl.op_types:
        raise ConfigError(f"{where}: op_types {sorted(decl.op_types)} lack {SUM_OP!r}, which the stream sum runs on")
    if not math.isclose(decl.ratio, size, rel_tol=_FLOAT_REL_TOL):
        raise ConfigError(f"{where}: ratio {decl.ratio:g} contradicts a sum of {size} streams ({size} in, one out: "
                          f"ratio {size})")
    if not math.isclose(decl.ops_per_byte, SUM_OPS_PER_BYTE, rel_tol=_FLOAT_REL_TOL):
        raise ConfigError(f"{where}: ops_per_byte {decl.ops_per_byte:g}, but the switch charges the sum "
                          f"{SUM_OPS_PER_BYTE:g} op per input byte (docs/reference.md §5): "
                          f"declare {SUM_OPS_PER_BYTE:g}")
    if decl.lossless:
        raise ConfigError(f"{where}: declared lossless, but a sum does not give back its terms")
    verdict = budget_check(replace(decl, placement=placement), module, Policy.REJECT)
    if verdict.action is Action.REJECTED:
        raise ConfigError(f"{where} refused by the module: {verdict.describe()}")
    return verdict
