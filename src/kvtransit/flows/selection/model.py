"""Query-aware KV selection, first-order model (Quest arXiv:2406.10774; docs/reference.md §7): bytes per decode step and
whether the scoring kernel fits the module.

A request's context KV lives remotely (the KV pool). Per decode step, every page's key summary crosses the link
and is scored against the query; the host ranks one number per page (comparisons: not the module's, docs/reference.md
§5) and fetches only the chosen pages' K and V. Without selection the step fetches all of the context's KV.

Bytes per step, over every layer (`SelectionStep`):
  all KV        = context × kv_bytes_per_token
  summaries     = pages × layers × kv_heads × head_dim × bytes_per_value × (1 mean | 2 min and max)
  chosen KV     = ⌈budget × pages⌉ × page_size × kv_bytes_per_token  (+ the tail after the last whole page)
  with selection = summaries + chosen KV
The score each page returns (one BF16 value a page and kv head) and the query going out are counted apart
(`score_bytes`, `query_bytes`): they are small, and they cross the other way or leave the module.

The scoring kernels (`scoring_declaration`): the representative key is a dot product, 2 FLOPs per BF16 value =
1.00 op/B of MAC (docs/reference.md §5, §7), in the published set: fits the high budget (3.96), transit-bound at the
low (0.40). With GQA the summed query of a group is used (Σ_h q_h·k̄ = (Σ_h q_h)·k̄), so the rate stays 1.00 op/B
(kernels/selection.py does the same). Quest's bound Σ max(q·min, q·max) needs a per-channel max: a comparison,
not published, so it is refused or runs on the host (`Policy.HOST`); it is bounded per query head, so its
arithmetic is the group size × 1.00 op/B (2 products, a max and an add per min/max pair of 4 bytes).

Pure: stdlib only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from kvtransit.model.catalog.links import Link
from kvtransit.model.catalog.models import ModelSpec
from kvtransit.model.errors import ConfigError
from kvtransit.model.module.budget import (
    BF16_BYTES,
    BUDGET_HIGH_OPS_PER_BYTE,
    BUDGET_LOW_OPS_PER_BYTE,
    BudgetResult,
    KernelDeclaration,
    Module,
    Policy,
    budget_check,
    transit_time,
)
from kvtransit.model.serving.traces import BLOCK_TOKENS

SUMMARY_KINDS: tuple[str, ...] = ("mean", "minmax")
DEFAULT_PAGE_SIZE = 16  # Quest's page (docs/reference.md §7)
# A dot product: 2 FLOPs per BF16 value (2 bytes) = 1.00 op/B (docs/reference.md §5 "other kernels", §7).
SCORING_FLOPS_PER_VALUE = 2
SCORING_OPS_PER_BYTE = SCORING_FLOPS_PER_VALUE / BF16_BYTES
# The module's two budgets (docs/reference.md §5), as modules for budget_check.
MODULE_HIGH = Module(name="budget-high", ops_per_byte=BUDGET_HIGH_OPS_PER_BYTE)
MODULE_LOW = Module(name="budget-low", ops_per_byte=BUDGET_LOW_OPS_PER_BYTE)


def _check_kind(kind: str) -> None:
    if kind not in SUMMARY_KINDS:
        raise ConfigError(f"unknown summary kind {kind!r} (choose from: {', '.join(SUMMARY_KINDS)})")


def check_page_size(page_size: int, block_tokens: int = BLOCK_TOKENS) -> int:
    """A page must tile the KV pool's blocks (512 tokens, flows/tier/prefix.py); else a ConfigError naming the valid
    sizes."""
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1 or block_tokens % page_size:
        valid = [p for p in range(1, block_tokens + 1) if block_tokens % p == 0]
        raise ConfigError(f"page size {page_size!r} does not divide the context's {block_tokens}-token blocks "
                          f"(valid page sizes: {', '.join(map(str, valid))})")
    return page_size


def check_budget(budget: float) -> float:
    if not (isinstance(budget, int | float) and 0 < budget <= 1):  # also rejects NaN
        raise ConfigError(f"page budget must be a fraction in (0, 1] (e.g. 1/4, 1/8, 1/16), got {budget!r}")
    return float(budget)


def scoring_declaration(model: ModelSpec, kind: str = "mean") -> KernelDeclaration:
    """The page-scoring kernel as the module sees it: summaries in, one score per page and kv head out."""
    _check_kind(kind)
    group = model.n_heads // model.kv_heads
    if kind == "mean":
        return KernelDeclaration("page-score-mean", ratio=float(model.head_dim), ops_per_byte=SCORING_OPS_PER_BYTE,
                                 op_types=frozenset({"mac"}))
    return KernelDeclaration("page-score-minmax", ratio=float(2 * model.head_dim),
                             ops_per_byte=SCORING_OPS_PER_BYTE * group, op_types=frozenset({"mac", "comparison"}))


def scoring_budget(model: ModelSpec, kind: str = "mean", module: Module = MODULE_HIGH,
                   policy: Policy = Policy.REJECT) -> BudgetResult:
    """budget_check of the scoring kernel: mean fits 3.96, is transit-bound at 0.40; minmax needs the host."""
    return budget_check(scoring_declaration(model, kind), module, policy)


@dataclass(frozen=True)
class SelectionStep:
    """One decode step's fetch of a remote context of `context_tokens`, with a page budget (None: fetch all)."""

    model: ModelSpec
    context_tokens: int
    budget: float | None = None
    kind: str = "mean"
    page_size: int = DEFAULT_PAGE_SIZE

    def __post_init__(self) -> None:
        if isinstance(self.context_tokens, bool) or not isinstance(self.context_tokens, int) or self.context_tokens < 1:
            raise ConfigError(f"context tokens must be an integer >= 1, got {self.context_tokens!r}")
        check_page_size(self.page_size)
        _check_kind(self.kind)
        if self.budget is not None:
            check_budget(self.budget)

    @property
    def pages(self) -> int:
        """Whole pages of the context (the tokens after the last whole page are always fetched)."""
        return self.context_tokens // self.page_size

    @property
    def tail_tokens(self) -> int:
        return self.context_tokens - self.pages * self.page_size

    @property
    def chosen_pages(self) -> int:
        if self.budget is None:
            return self.pages
        return min(self.pages, max(1, math.ceil(self.budget * self.pages - 1e-9))) if self.pages else 0

    @property
    def all_kv_bytes(self) -> int:
        return self.context_tokens * self.model.kv_bytes_per_token

    @property
    def summary_bytes(self) -> int:
        if self.budget is None:
            return 0
        vectors = 1 if self.kind == "mean" else 2
        m = self.model
        return self.pages * m.layers * m.kv_heads * m.head_dim * m.bytes_per_value * vectors

    @property
    def chosen_kv_bytes(self) -> int:
        return (self.chosen_pages * self.page_size + self.tail_tokens) * self.model.kv_bytes_per_token

    @property
    def fetched_bytes(self) -> int:
        """What crosses the link per step: all KV without selection; summaries + chosen pages with it."""
        return self.summary_bytes + self.chosen_kv_bytes

    @property
    def score_bytes(self) -> int:
        """One BF16 score per page, kv head and layer, back to the host (0 without selection)."""
        m = self.model
        return 0 if self.budget is None else self.pages * m.layers * m.kv_heads * BF16_BYTES

    @property
    def query_bytes(self) -> int:
        """The query sent out to be scored against: every query head, every layer (0 without selection)."""
        m = self.model
        return 0 if self.budget is None else m.layers * m.n_heads * m.head_dim * m.bytes_per_value

    @property
    def reduction(self) -> float:
        """All KV bytes / fetched bytes: ≈ 1 / budget when the summaries are small."""
        return self.all_kv_bytes / self.fetched_bytes

    def fetch_time_s(self, link: Link, module: Module | None = None) -> float:
        """Two sequential legs when selecting (summaries, then the chosen pages: the host must rank between them),
        one without. A leg is a request to the pool and its answer: 2 latencies + bytes / bandwidth (docs/reference.md
        §2). `module`: the summaries are scored in transit on their way in (their bytes are the module's input), which
        adds its latency and, when the module is slower than the wire, its compute (docs/reference.md §5)."""
        if self.budget is None:
            return link.latency_s + link.transfer_time_s(self.all_kv_bytes)
        summaries = link.latency_s + link.transfer_time_s(self.summary_bytes)
        if module is not None:
            on_line = replace(scoring_declaration(self.model, self.kind), ratio=1.0)  # summaries cross whole
            summaries = link.latency_s + transit_time(self.summary_bytes, on_line, link.bandwidth_Bps,
                                                      link.latency_s, module).total_s
        return summaries + link.latency_s + link.transfer_time_s(self.chosen_kv_bytes)
