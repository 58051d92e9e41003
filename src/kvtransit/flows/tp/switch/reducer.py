"""The switch's bookkeeping, sans-IO: which group and collective a part belongs to, when all n are in, the sum.

A group steps through its collectives in order, (step, all-reduce) = (0, 0), (0, 1), …, (1, 0), …, one at a
time: no rank can send the next before it got the sum of this one. So a part is taken only for the collective
in progress, or, when none is, for one after the last completed within the next step; anything else (a step
already summed, a step from the future, another collective while one is open, a rank twice, a group this switch
does not serve) is rejected with a reason naming it.

The sum is the module kernel `kernels/stream_sum.py` declares (0.50 op/B, placement switch), or a kernel file's
declaration of it (checked by `kernel_check.py`), judged once against the module's budget
(`model.module.budget_check`) and charged its energy (`model/cost/energy.py: module_energy_j`) per input byte at model
scale. Each sum counts the streams it merged (`streams_merged`: the placement test's streams seen).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kvtransit.kernels.stream_sum import BF16, sum_streams
from kvtransit.kernels.stream_sum import declaration as sum_declaration
from kvtransit.model.cost.energy import module_energy_j
from kvtransit.model.module.budget import BudgetResult, KernelDeclaration, Module, budget_check

# The sum goes through the kernel a block of values at a time: its float32 accumulator then stays in cache
# (256 Ki values = 1 MiB) instead of a copy as large as the stream (64 MiB for 16 Mi values). Measured,
# benchmarks/switch_sum.py, 2 streams of 16 Mi values on the 2-core dev box: whole, 0.41x a bare numpy add; in
# blocks, 0.77x (8 streams: 2.27x).
SUM_BLOCK_VALUES = 1 << 18


def blocked_sum(parts: list[np.ndarray]) -> np.ndarray:
    """`sum_streams(parts)`, bit for bit (every value's sum is independent of the others), a block at a time."""
    values = parts[0].size
    if values <= SUM_BLOCK_VALUES:
        return sum_streams(parts)
    total = np.empty(values, dtype=BF16)
    for start in range(0, values, SUM_BLOCK_VALUES):
        end = start + SUM_BLOCK_VALUES
        total[start:end] = sum_streams([part[start:end] for part in parts])
    return total


class Rejected(Exception):
    """A part the switch will not sum; the message says why (sent back to the rank as an ABORT)."""


@dataclass(frozen=True)
class Reduction:
    """All n parts of one collective are in: their sum, and when the last was due."""

    step: int
    collective: int
    total: np.ndarray
    last_due_ns: int
    input_bytes: int


@dataclass
class GroupReducer:
    group: int
    size: int
    module: Module = field(default_factory=Module)
    scale: float = 1.0  # bytes here are model bytes × scale: energy is charged at model scale
    collectives: int = 0  # all-reduces a step, to name the next one (2 a layer; 1: one a step); 0: unknown
    # The kernel declared for the sum (None: the stream sum's own, `kernels/stream_sum.declaration(size)`).
    declaration: KernelDeclaration | None = None
    completed: tuple[int, int] | None = None
    sums: int = 0
    streams_merged: int = 0  # ingress streams summed into one, over every sum (size per sum)
    input_bytes: int = 0
    energy_j: float = 0.0
    _open: tuple[int, int] | None = None
    _parts: dict[int, np.ndarray] = field(default_factory=dict)
    _last_due_ns: int = 0

    def __post_init__(self) -> None:
        if self.size < 2:
            raise ValueError(f"a switch sums at least 2 ranks, got a group of {self.size}")
        if self.declaration is None:
            self.declaration = sum_declaration(self.size)
        self.budget: BudgetResult = budget_check(self.declaration, self.module)

    @property
    def in_progress(self) -> tuple[int, int] | None:
        return self._open

    def describe(self, step: int, collective: int) -> str:
        """`step s, layer l (all-reduce j)`: two all-reduces a layer; one a step covers every layer."""
        if self.collectives == 1:
            return f"step {step}, every layer (one all-reduce a step)"
        if self.collectives > 1:
            return f"step {step}, layer {collective // 2} (all-reduce {collective})"
        return f"step {step}, all-reduce {collective}"

    def where_next(self) -> str:
        """The collective in progress or the next one, for a failure's reason."""
        if self._open is not None:
            return self.describe(*self._open)
        if self.completed is None:
            return self.describe(0, 0)
        step, collective = self.completed
        if self.collectives and collective + 1 >= self.collectives:
            return self.describe(step + 1, 0)
        if self.collectives:
            return self.describe(step, collective + 1)
        return f"step {step} after all-reduce {collective}"

    def check_group(self, group: int) -> None:
        if group != self.group:
            raise Rejected(f"unknown group {group} (this switch serves group {self.group})")

    def accept(self, group: int, rank: int, step: int, collective: int, payload: bytes | bytearray | memoryview,
               due_ns: int) -> Reduction | None:
        """Take rank `rank`'s part; the Reduction once all `size` parts of the collective are in."""
        self.check_group(group)
        if not 0 <= rank < self.size:
            raise Rejected(f"rank {rank} is not in group {group} of {self.size}")
        key = (step, collective)
        if self._open is None:
            if self.completed is not None and key <= self.completed:
                raise Rejected(f"step {step}, all-reduce {collective} from rank {rank}: already summed "
                               f"(the group is past step {self.completed[0]}, all-reduce {self.completed[1]})")
            last_step = -1 if self.completed is None else self.completed[0]
            if step > last_step + 1:
                raise Rejected(f"step {step} from rank {rank}: unknown step (the group is at step "
                               f"{max(last_step, 0)})")
            self._open = key
        elif key != self._open:
            raise Rejected(f"step {step}, all-reduce {collective} from rank {rank}: unknown step (step "
                           f"{self._open[0]}, all-reduce {self._open[1]} is in progress)")
        if rank in self._parts:
            raise Rejected(f"rank {rank} sent step {step}, all-reduce {collective} twice")
        part = np.frombuffer(payload, dtype=BF16)
        if self._parts and part.shape != next(iter(self._parts.values())).shape:
            raise Rejected(f"rank {rank}'s part of step {step}, all-reduce {collective} has {part.nbytes} B, "
                           f"the others {next(iter(self._parts.values())).nbytes} B")
        self._parts[rank] = part
        self._last_due_ns = max(self._last_due_ns, due_ns)
        if len(self._parts) < self.size:
            return None
        parts = [self._parts[r] for r in range(self.size)]
        total = blocked_sum(parts)
        nbytes = sum(p.nbytes for p in parts)
        reduction = Reduction(step, collective, total, self._last_due_ns, nbytes)
        self.completed, self._open, self._parts, self._last_due_ns = key, None, {}, 0
        self.sums += 1
        self.streams_merged += len(parts)
        self.input_bytes += nbytes
        self.energy_j += module_energy_j(self.module, nbytes / self.scale)
        return reduction
