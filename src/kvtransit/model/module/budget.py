"""The compute-in-transit module: kernel declarations and the budget check (docs/reference.md §5).

A *declaration* says what a kernel costs; a *module* says what the optics can afford. `budget_check`
judges one against the other: fits, transit-bound (and by how much it slows the link), not allowed (the
kernel needs an operation the module does not publish) or misplaced (it combines more streams than its
placement sees), and says what happens then, by policy.
Pure: no I/O, no clock.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field, replace

from kvtransit.model.errors import ConfigError, require_positive

# Operations the module publishes (Kundu et al., arXiv:2608.21536, via docs/reference.md §5).
PUBLISHED_OPS = frozenset({"fft", "ntt", "mac", "modular", "float"})
# Operations kernels may ask for that the module does not publish (docs/reference.md §5).
UNPUBLISHED_OPS = frozenset({"comparison", "rounding", "topk"})
# Wiring, not arithmetic: `gather` is the fixed selection of the kept band (docs/reference.md §5, under the deck's
# sketch). It costs no operations and needs nothing published, so the budget check ignores it.
WIRING_OPS = frozenset({"gather"})
KNOWN_OPS = PUBLISHED_OPS | UNPUBLISHED_OPS | WIRING_OPS
# Ops whose output depends on the data's values (a branch, a data-chosen selection). Without one, a kernel
# is a fixed map: n input bytes always become n / ratio output bytes (see `lossless` below).
DATA_DEPENDENT_OPS = frozenset({"comparison", "topk"})

# Arithmetic budget at line rate, operations per byte (docs/reference.md §5).
BUDGET_LOW_OPS_PER_BYTE = 0.40
BUDGET_HIGH_OPS_PER_BYTE = 3.96
# The simulator's illustrative in-transit stage: 1.6 ops per line byte, 1 pJ per input bit, 1 µs added,
# FFT free because it is passive optics (docs/reference.md §5).
SIM_OPS_PER_LINE_BYTE = 1.6
SIM_PJ_PER_INPUT_BIT = 1.0
SIM_ADDED_LATENCY_S = 1e-6
# QSFP56: 200 Gb/s line rate = 25 GB/s (docs/reference.md §2).
QSFP56_LINE_RATE_BPS = 25e9

# A real FFT of length N costs 2.5·N·log2 N flops, i.e. 2.5·log2 N per value; on BF16 (2 bytes per
# value) that is 1.25·log2 N operations per byte (docs/reference.md §5 kernel table).
FFT_OPS_PER_VALUE_PER_LOG2N = 2.5
BF16_BYTES = 2

# The transforms a kernel may declare, and the published op each one runs on. Their cost, when charged, is
# the FFT's 1.25·log2 N per BF16 byte for all three:
# - dct: a DCT-II of length N is computed through one real FFT of length N (Makhoul 1980, and the codec's
#   own `kernels/bandkeep.py`), so it is counted as that FFT; any N >= 2 (the codec takes any block).
# - ntt: docs/reference.md §5 gives the NTT no count of its own ("ML-KEM polynomial multiplication = NTT (in set)"),
#   so it is charged as the FFT: the same N/2·log2 N butterflies, in modular instead of complex arithmetic.
# fft and ntt need N a power of two (the radix-2 butterflies; ML-KEM's NTT is of length 256).
TRANSFORM_NONE = "none"
TRANSFORM_OPS = {"fft": "fft", "dct": "fft", "ntt": "ntt"}
TRANSFORMS = (TRANSFORM_NONE, *TRANSFORM_OPS)
POWER_OF_TWO_TRANSFORMS = frozenset({"fft", "ntt"})

# What each placement sees (docs/reference.md §5, the deck's sketch: "pluggable": one stream; "switch": many
# streams, can sum them). None: as many as the switch has ports, i.e. no limit the model knows.
PLACEMENT_STREAMS: dict[str, int | None] = {"pluggable": 1, "switch": None}
PLACEMENTS = tuple(PLACEMENT_STREAMS)
# The analogue path's precision: at least one bit; 32 bits is FP32, beyond any analogue path (and the
# codec's own limit, `kernels/registry.py`).
PRECISION_BITS_RANGE = (1, 32)


def fft_ops_per_byte(n: int, bytes_per_value: int = BF16_BYTES) -> float:
    """Operations per input byte of a real FFT of length `n` (1.25·log2 n on BF16)."""
    if n < 2:
        raise ConfigError(f"transform length must be >= 2, got {n}")
    return FFT_OPS_PER_VALUE_PER_LOG2N * math.log2(n) / bytes_per_value


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class KernelDeclaration:
    """What a kernel costs on the module (the deck's sketch, docs/reference.md §5; `LinkKernel` is the deck's name).

    `ops_per_byte` counts operations per *input* byte besides the transform; the transform's own cost
    comes from `transform` and `transform_length` N and counts against the budget only when
    `transform_charged` (passive optics make it free). `transform` left unsaid (None) means an FFT when a
    length is given (what docs/reference.md §5's table and earlier declarations mean by a bare length), else none.
    `streams` is how many streams the kernel combines (2 for a sum of two): more than one needs a switch.
    `lossless` says the output gives back the input exactly; `precision_bits` is what the analogue path
    delivers (None: not declared).
    """

    name: str
    ratio: float = 1.0  # input bytes / output bytes
    ops_per_byte: float = 0.0
    op_types: frozenset[str] = field(default_factory=frozenset)
    transform_charged: bool = True
    transform_length: int | None = None
    precision_bits: int | None = None
    placement: str = "pluggable"
    transform: str | None = None  # "none" | "fft" | "dct" | "ntt"; always set after construction
    lossless: bool = False
    streams: int = 1

    @property
    def identity(self) -> bool:
        """It moves no byte off the link and runs nothing: ratio 1, no operation, no transform, one stream."""
        return (self.ratio == 1.0 and self.ops_per_byte == 0.0 and (self.transform in (None, "none"))
                and self.streams == 1 and not self.op_types)

    def __post_init__(self) -> None:
        object.__setattr__(self, "op_types", frozenset(self.op_types))
        if not self.name:
            raise ConfigError("kernel declaration needs a name")
        where = f"kernel {self.name!r}"
        require_positive(f"{where}: ratio", self.ratio)
        if not math.isfinite(self.ratio):
            raise ConfigError(f"{where}: ratio must be finite, got {self.ratio!r}")
        if not (self.ops_per_byte >= 0 and math.isfinite(self.ops_per_byte)):
            raise ConfigError(f"{where}: ops_per_byte must be >= 0, got {self.ops_per_byte!r}")
        unknown = self.op_types - KNOWN_OPS
        if unknown:
            raise ConfigError(
                f"{where}: op_types: unknown op type {sorted(unknown)[0]!r} "
                f"(choose from: {', '.join(sorted(KNOWN_OPS))})"
            )
        self._check_transform(where)
        lo, hi = PRECISION_BITS_RANGE
        if self.precision_bits is not None and not (_is_int(self.precision_bits) and lo <= self.precision_bits <= hi):
            raise ConfigError(f"{where}: precision_bits must be in {lo}..{hi}, got {self.precision_bits!r}")
        if self.placement not in PLACEMENTS:
            raise ConfigError(
                f"{where}: unknown placement {self.placement!r} (choose from: {', '.join(PLACEMENTS)})"
            )
        if not (_is_int(self.streams) and self.streams >= 1):
            raise ConfigError(f"{where}: streams must be an integer >= 1 (2 or more: a kernel that combines "
                              f"streams), got {self.streams!r}")
        self._check_lossless(where)

    def _check_transform(self, where: str) -> None:
        n = self.transform_length
        transform = self.transform
        if transform is None:
            transform = TRANSFORM_NONE if n is None else "fft"
            object.__setattr__(self, "transform", transform)
        if transform not in TRANSFORMS:
            raise ConfigError(f"{where}: unknown transform {transform!r} (choose from: {', '.join(TRANSFORMS)})")
        if transform == TRANSFORM_NONE:
            if n is not None:
                raise ConfigError(f"{where}: transform_length {n} given with transform 'none' "
                                  f"(choose a transform: {', '.join(TRANSFORM_OPS)})")
            return
        if n is None:
            raise ConfigError(f"{where}: transform {transform!r} needs transform_length N")
        if not (_is_int(n) and n >= 2):
            raise ConfigError(f"{where}: transform_length must be an integer >= 2, got {n!r}")
        if transform in POWER_OF_TWO_TRANSFORMS and n & (n - 1):
            raise ConfigError(f"{where}: transform_length must be a power of two for {transform}, got {n}")
        op = TRANSFORM_OPS[transform]
        if op not in self.op_types:
            raise ConfigError(f"{where}: op_types must list {op!r}: transform {transform!r} runs on it")

    def _check_lossless(self, where: str) -> None:
        """Refuse the one contradiction: lossless, ratio > 1, and no op that depends on the data.

        Without a data-dependent op the kernel is a fixed map from n input bytes to n / ratio output bytes;
        with ratio > 1 there are fewer possible outputs than inputs, so two inputs share an output and the
        map cannot be inverted (pigeonhole). A lossless ratio above 1 is an average over real data (an
        entropy coder), which needs variable-length output, i.e. an op that branches on the data.
        A lossless kernel with ratio <= 1 (a transform that keeps every coefficient, or widens them) is fine.
        """
        if self.lossless and self.ratio > 1 and not self.op_types & DATA_DEPENDENT_OPS:
            raise ConfigError(
                f"{where}: lossless with ratio {self.ratio:g} > 1 is impossible: its ops are a fixed map onto "
                f"fewer bytes than it reads, so two inputs share an output (a lossless ratio > 1 needs a "
                f"data-dependent op: {', '.join(sorted(DATA_DEPENDENT_OPS))})"
            )

    @property
    def has_transform(self) -> bool:
        return self.transform != TRANSFORM_NONE

    @property
    def transform_ops_per_byte(self) -> float:
        """The transform's cost per input byte, charged or not (0 without a transform)."""
        return fft_ops_per_byte(self.transform_length) if self.transform_length is not None else 0.0

    @property
    def charged_transform_ops_per_byte(self) -> float:
        return self.transform_ops_per_byte if self.transform_charged else 0.0

    @property
    def charged_ops_per_byte(self) -> float:
        """Operations per input byte that count against the module's budget."""
        return self.ops_per_byte + self.charged_transform_ops_per_byte

    @property
    def unpublished_ops(self) -> frozenset[str]:
        return self.op_types - PUBLISHED_OPS - WIRING_OPS

    @property
    def wiring_ops(self) -> frozenset[str]:
        return self.op_types & WIRING_OPS

    @property
    def in_published_set(self) -> bool:
        return not self.unpublished_ops


# Flows whose bytes must arrive bit for bit: "Weights need a lossless kernel" (docs/reference.md §7); a LoRA adapter is
# weights too. Any other flow (KV, activations, ciphertexts' transfer) is judged by its precision test instead.
LOSSLESS_FLOWS = frozenset({"weights", "adapters"})
WEIGHT_VALUE_BITS = 8 * BF16_BYTES  # a BF16 weight (docs/reference.md §1)


def flow_check(decl: KernelDeclaration, flow: str) -> None:
    """Refuse, with a one-line ConfigError, a kernel declared lossy on a flow that needs lossless (docs/reference.md
    §7).

    `lossless` is the declaration's own claim (its consistency with the ratio is `_check_lossless`'s job); a
    kernel that is not declared lossless may drop or round values, and a weight so changed is another model."""
    if flow not in LOSSLESS_FLOWS:
        return
    if not decl.lossless:
        raise ConfigError(f"kernel {decl.name!r} refused on flow {flow!r}: the flow needs a lossless kernel "
                          f"(docs/reference.md §7) and this one is not declared lossless (lossless=false)")
    # An analogue path that delivers fewer bits than a BF16 value holds cannot give its 16 bits back exactly,
    # whatever the kernel claims.
    if decl.precision_bits is not None and decl.precision_bits < WEIGHT_VALUE_BITS:
        raise ConfigError(f"kernel {decl.name!r} refused on flow {flow!r}: declared lossless, but its analogue path "
                          f"delivers {decl.precision_bits} bits < the {WEIGHT_VALUE_BITS} bits of a BF16 weight")


# The deck's name for a declaration (docs/reference.md §5: "illustrative, not an existing API"). The class keeps the
# name the code base uses everywhere (type hints, the middlebox's kernel stage, the hand-off model).
LinkKernel = KernelDeclaration


@dataclass(frozen=True)
class PlacementCheck:
    """Whether the placement sees every stream the kernel combines (docs/reference.md §5: a sum needs a switch)."""

    placement: str
    streams_needed: int
    streams_seen: int | None  # None: many (a switch)

    @property
    def ok(self) -> bool:
        return self.streams_seen is None or self.streams_needed <= self.streams_seen

    def describe(self) -> str:
        seen = "many streams" if self.streams_seen is None else (
            "1 stream" if self.streams_seen == 1 else f"{self.streams_seen} streams")
        needed = f"{self.streams_needed} stream" + ("" if self.streams_needed == 1 else "s")
        if self.ok:
            return f"ok: needs {needed}, a {self.placement} sees {seen}"
        return f"needs {needed} but a {self.placement} sees {seen} (place it on a switch)"


def placement_check(decl: KernelDeclaration) -> PlacementCheck:
    return PlacementCheck(decl.placement, decl.streams, PLACEMENT_STREAMS[decl.placement])


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
        """Stage energy = input bits × pJ per input bit (docs/reference.md §5)."""
        return input_bytes * 8 * self.pj_per_input_bit * 1e-12


MODULE_BUDGETS = {
    "low": BUDGET_LOW_OPS_PER_BYTE,
    "sim": SIM_OPS_PER_LINE_BYTE,
    "high": BUDGET_HIGH_OPS_PER_BYTE,
}


def budget_ops_per_byte(budget: str | float) -> float:
    """A module budget as every command takes it (`--module-budget`: a name above or a number of ops per line
    byte, checked by model/field_checks.py: module_budget) in ops per line byte."""
    return MODULE_BUDGETS[budget] if isinstance(budget, str) else float(budget)


class Verdict(enum.Enum):
    FITS = "fits"
    TRANSIT_BOUND = "transit-bound"
    NOT_ALLOWED = "not-allowed"
    MISPLACED = "misplaced"  # combines more streams than its placement sees (a sum on a pluggable)


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
    reason: str = ""  # why a misplaced kernel is refused

    @property
    def fits(self) -> bool:
        return self.verdict is Verdict.FITS

    def describe(self) -> str:
        if self.verdict is Verdict.MISPLACED:
            return f"misplaced: {self.reason} -> {self.action.value}"
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
    """Judge `decl` against its placement, `module`'s published op set and per-byte budget, in that order.

    A kernel that combines more streams than its placement sees is refused whatever the policy: the host
    at one end of the link sees one stream too. Slowdown: the module must do `charged` ops per byte but
    affords `budget` per byte at line rate, so it runs at line_rate × budget / charged, i.e.
    time = max(bytes/rate, ops/(budget × rate)) (docs/reference.md §5).
    """
    charged = decl.charged_ops_per_byte
    budget = module.ops_per_byte
    placed = placement_check(decl)
    if not placed.ok:
        return BudgetResult(Verdict.MISPLACED, Action.REJECTED, charged, budget, 1.0, decl.unpublished_ops,
                            reason=placed.describe())
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

    docs/reference.md §5's kernel table judges its two "fits" columns on arithmetic alone: requantise BF16→FP8
    is "in set: no" yet "fits high budget: yes". The table passes `require_published_ops=False`.
    """
    d = replace(decl, transform_charged=transform_charged)
    within = d.charged_ops_per_byte <= budget_ops_per_byte
    return within and (d.in_published_set or not require_published_ops)


@dataclass(frozen=True)
class TransitTime:
    """The modelled time of one hand-off through the module onto a link (docs/reference.md §5)."""

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
    """`link_latency + 1 µs + max(wire_bytes / link_bw, ops / (1.6 × link_bw))` (docs/reference.md §5)."""
    require_positive("link bandwidth", link_bandwidth_Bps)
    wire_bytes = input_bytes / decl.ratio
    ops = input_bytes * decl.charged_ops_per_byte
    return TransitTime(
        latency_s=link_latency_s + module.added_latency_s,
        wire_s=wire_bytes / link_bandwidth_Bps,
        compute_s=ops / (module.ops_per_byte * link_bandwidth_Bps),
    )
