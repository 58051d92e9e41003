"""The compute-in-transit module: kernel declarations and the budget check (REFERENCE §5).

A *declaration* says what a kernel costs; a *module* says what the optics can afford. `budget_check`
judges one against the other: fits, transit-bound (and by how much it slows the link), or not allowed
(the kernel needs an operation the module does not publish), and says what happens then, by policy.
Pure: no I/O, no clock.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field, replace

from .errors import ConfigError, require_positive

# Operations the module publishes (Kundu et al., arXiv:2608.21536, via REFERENCE §5).
PUBLISHED_OPS = frozenset({"fft", "ntt", "mac", "modular", "float"})
# Operations kernels may ask for that the module does not publish (REFERENCE §5).
UNPUBLISHED_OPS = frozenset({"comparison", "rounding", "topk"})
KNOWN_OPS = PUBLISHED_OPS | UNPUBLISHED_OPS

# Arithmetic budget at line rate, operations per byte (REFERENCE §5).
BUDGET_LOW_OPS_PER_BYTE = 0.40
BUDGET_HIGH_OPS_PER_BYTE = 3.96
# The simulator's illustrative in-transit stage: 1.6 ops per line byte, 1 pJ per input bit, 1 µs added,
# FFT free because it is passive optics (REFERENCE §5).
SIM_OPS_PER_LINE_BYTE = 1.6
SIM_PJ_PER_INPUT_BIT = 1.0
SIM_ADDED_LATENCY_S = 1e-6
# QSFP56: 200 Gb/s line rate = 25 GB/s (REFERENCE §2).
QSFP56_LINE_RATE_BPS = 25e9

# A real FFT of length N costs 2.5·N·log2 N flops, i.e. 2.5·log2 N per value; on BF16 (2 bytes per
# value) that is 1.25·log2 N operations per byte (REFERENCE §5 kernel table).
FFT_OPS_PER_VALUE_PER_LOG2N = 2.5
BF16_BYTES = 2

PLACEMENTS = ("pluggable", "switch")


def fft_ops_per_byte(n: int, bytes_per_value: int = BF16_BYTES) -> float:
    """Operations per input byte of a real FFT of length `n` (1.25·log2 n on BF16)."""
    if n < 2:
        raise ConfigError(f"transform length must be >= 2, got {n}")
    return FFT_OPS_PER_VALUE_PER_LOG2N * math.log2(n) / bytes_per_value


@dataclass(frozen=True)
class KernelDeclaration:
    """What a kernel costs on the module (the deck's sketch, REFERENCE §5).

    `ops_per_byte` counts operations per *input* byte besides the transform; the transform's own cost
    comes from `transform_length` (None: no transform) and counts against the budget only when
    `transform_charged` (passive optics make it free).
    """

    name: str
    ratio: float = 1.0  # input bytes / output bytes
    ops_per_byte: float = 0.0
    op_types: frozenset[str] = field(default_factory=frozenset)
    transform_charged: bool = True
    transform_length: int | None = None
    precision_bits: int | None = None
    placement: str = "pluggable"

    def __post_init__(self) -> None:
        object.__setattr__(self, "op_types", frozenset(self.op_types))
        if not self.name:
            raise ConfigError("kernel declaration needs a name")
        require_positive(f"kernel {self.name!r}: ratio", self.ratio)
        if not (self.ops_per_byte >= 0 and math.isfinite(self.ops_per_byte)):
            raise ConfigError(f"kernel {self.name!r}: ops_per_byte must be >= 0, got {self.ops_per_byte!r}")
        unknown = self.op_types - KNOWN_OPS
        if unknown:
            raise ConfigError(
                f"kernel {self.name!r}: unknown op type {sorted(unknown)[0]!r} "
                f"(choose from: {', '.join(sorted(KNOWN_OPS))})"
            )
        if self.transform_length is not None and self.transform_length < 2:
            raise ConfigError(f"kernel {self.name!r}: transform_length must be >= 2, got {self.transform_length}")
        if self.precision_bits is not None and not 1 <= self.precision_bits <= 64:
            raise ConfigError(f"kernel {self.name!r}: precision_bits must be in 1..64, got {self.precision_bits}")
        if self.placement not in PLACEMENTS:
            raise ConfigError(
                f"kernel {self.name!r}: unknown placement {self.placement!r} (choose from: {', '.join(PLACEMENTS)})"
            )

    @property
    def transform_ops_per_byte(self) -> float:
        return 0.0 if self.transform_length is None else fft_ops_per_byte(self.transform_length)

    @property
    def charged_ops_per_byte(self) -> float:
        """Operations per input byte that count against the module's budget."""
        return self.ops_per_byte + (self.transform_ops_per_byte if self.transform_charged else 0.0)

    @property
    def unpublished_ops(self) -> frozenset[str]:
        return self.op_types - PUBLISHED_OPS

    @property
    def in_published_set(self) -> bool:
        return not self.unpublished_ops


@dataclass(frozen=True)
class Module:
    """A pluggable that computes on the bytes crossing it (default: the QSFP56 optical-FFT module)."""

    name: str = "qsfp56"
    line_rate_Bps: float = QSFP56_LINE_RATE_BPS
    ops_per_byte: float = SIM_OPS_PER_LINE_BYTE
    pj_per_input_bit: float = SIM_PJ_PER_INPUT_BIT
    added_latency_s: float = SIM_ADDED_LATENCY_S

    def __post_init__(self) -> None:
        require_positive("module line_rate_Bps", self.line_rate_Bps)
        require_positive("module ops_per_byte", self.ops_per_byte)
        if self.pj_per_input_bit < 0 or self.added_latency_s < 0:
            raise ConfigError("module energy and added latency must be >= 0")

    def energy_j(self, input_bytes: float) -> float:
        """Stage energy = input bits × pJ per input bit (REFERENCE §5)."""
        return input_bytes * 8 * self.pj_per_input_bit * 1e-12


MODULE_BUDGETS = {
    "low": BUDGET_LOW_OPS_PER_BYTE,
    "sim": SIM_OPS_PER_LINE_BYTE,
    "high": BUDGET_HIGH_OPS_PER_BYTE,
}


class Verdict(enum.Enum):
    FITS = "fits"
    TRANSIT_BOUND = "transit-bound"
    NOT_ALLOWED = "not-allowed"


class Policy(enum.Enum):
    """What to do with a kernel that needs an unpublished operation."""

    REJECT = "reject"
    HOST = "host"


class Action(enum.Enum):
    IN_TRANSIT = "in-transit"
    REJECTED = "rejected"
    ON_HOST = "host"


@dataclass(frozen=True)
class BudgetResult:
    verdict: Verdict
    action: Action
    charged_ops_per_byte: float
    budget_ops_per_byte: float
    slowdown: float  # ≥ 1: how much slower than line rate the module runs this kernel
    unpublished_ops: frozenset[str]

    @property
    def fits(self) -> bool:
        return self.verdict is Verdict.FITS

    def describe(self) -> str:
        if self.verdict is Verdict.NOT_ALLOWED:
            ops = ", ".join(sorted(self.unpublished_ops))
            return f"not allowed (needs {ops}, not published) -> {self.action.value}"
        if self.verdict is Verdict.TRANSIT_BOUND:
            return (
                f"transit-bound: {self.charged_ops_per_byte:.2f} ops/B > budget "
                f"{self.budget_ops_per_byte:.2f}, link slowed x{self.slowdown:.2f}"
            )
        return f"fits: {self.charged_ops_per_byte:.2f} ops/B <= budget {self.budget_ops_per_byte:.2f}"


def budget_check(decl: KernelDeclaration, module: Module = Module(), policy: Policy = Policy.REJECT) -> BudgetResult:
    """Judge `decl` against `module`'s published op set and per-byte budget.

    Slowdown: the module must do `charged` ops per byte but affords `budget` per byte at line rate, so it
    runs at line_rate × budget / charged, i.e. time = max(bytes/rate, ops/(budget × rate)) (REFERENCE §5).
    """
    charged = decl.charged_ops_per_byte
    budget = module.ops_per_byte
    if decl.unpublished_ops:
        action = Action.REJECTED if policy is Policy.REJECT else Action.ON_HOST
        return BudgetResult(Verdict.NOT_ALLOWED, action, charged, budget, 1.0, decl.unpublished_ops)
    slowdown = max(1.0, charged / budget)
    verdict = Verdict.FITS if charged <= budget else Verdict.TRANSIT_BOUND
    return BudgetResult(verdict, Action.IN_TRANSIT, charged, budget, slowdown, frozenset())


def fits_budget(
    decl: KernelDeclaration, budget_ops_per_byte: float, *, transform_charged: bool, require_published_ops: bool = True
) -> bool:
    """Within `budget` ops per byte (and, unless `require_published_ops=False`, in the published set).

    REFERENCE §5's kernel table judges its two "fits" columns on arithmetic alone: requantise BF16→FP8
    is "in set: no" yet "fits high budget: yes". The table passes `require_published_ops=False`.
    """
    d = replace(decl, transform_charged=transform_charged)
    within = d.charged_ops_per_byte <= budget_ops_per_byte
    return within and (d.in_published_set or not require_published_ops)


@dataclass(frozen=True)
class TransitTime:
    """The modelled time of one hand-off through the module onto a link (REFERENCE §5)."""

    latency_s: float  # link latency + the module's added latency
    wire_s: float  # wire bytes / link bandwidth
    compute_s: float  # ops / (ops per line byte × link bandwidth)

    @property
    def total_s(self) -> float:
        return self.latency_s + max(self.wire_s, self.compute_s)

    @property
    def transit_bound(self) -> bool:
        return self.compute_s > self.wire_s


def transit_time(
    input_bytes: int, decl: KernelDeclaration, link_bandwidth_Bps: float, link_latency_s: float,
    module: Module = Module(),
) -> TransitTime:
    """`link_latency + 1 µs + max(wire_bytes / link_bw, ops / (1.6 × link_bw))` (REFERENCE §5)."""
    require_positive("link bandwidth", link_bandwidth_Bps)
    wire_bytes = input_bytes / decl.ratio
    ops = input_bytes * decl.charged_ops_per_byte
    return TransitTime(
        latency_s=link_latency_s + module.added_latency_s,
        wire_s=wire_bytes / link_bandwidth_Bps,
        compute_s=ops / (module.ops_per_byte * link_bandwidth_Bps),
    )
