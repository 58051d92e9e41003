"""Ring attention, first-order model (Liu et al., arXiv:2310.01889; docs/reference.md §7): the time of a hop, and where
a codec on the ring's links starts to pay.

n devices each hold a block of `block_tokens` of a long prompt. Per layer, every device sends its KV block to the
next n − 1 times while computing blockwise attention on the block it holds; overlapped, a hop costs
`max(block_bytes / bw + latency, block attention compute)` (docs/reference.md §7). One layer = the first block's compute
(the device's own block, nothing in flight yet) + (n − 1) hops.

- block_bytes: one layer's K and V of the block, 2 × kv_heads × head_dim × bytes_per_value a token (docs/reference.md
§1),
  divided by the codec's ratio on the wire. With a declared kernel the link leg is the module's transit time
  (docs/reference.md §5: latency + 1 µs + max(wire / bw, ops / (1.6 × bw))).
- block attention compute: the block's queries against one KV block, off the diagonal (no causal mask):
  QKᵀ and PV, 2 FLOPs a multiply-add each, 4 · d_model · t_q · t_k FLOPs (docs/reference.md §3's attention term
  2·d·s·(s+1) is the causal, halved form of this), and the HBM bytes of reading Q, K, V and writing O, costed on
  the roofline of model/cost/roofline.py (`step_time`, peak × 0.55 and HBM × 0.80), without the per-step overhead
  (a hop is not a step).

A codec of ratio r pays only while the uncompressed hop is link-bound: compression shortens the link leg, never the
compute. So it starts to pay below the bandwidth bw* = block_bytes / (compute − latency) (`crossover_bandwidth_Bps`)
and, at a given link, below the block size t* where the link leg equals the compute (`crossover_block_tokens`:
the link leg grows as t, the compute as t²). It hides the hop fully from bw*/r up.

Pure: stdlib only.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvtransit.model.catalog.devices import Device
from kvtransit.model.catalog.links import Link
from kvtransit.model.catalog.models import KV_TENSORS, ModelSpec
from kvtransit.model.cost.roofline import StepWork, step_time
from kvtransit.model.errors import ConfigError
from kvtransit.model.module.budget import KernelDeclaration, Module, transit_time

# QKᵀ and PV over a block pair: 2 matmuls × 2 FLOPs per multiply-add = 4 · d_model FLOPs per (query, key) pair.
ATTENTION_FLOPS_PER_PAIR_PER_D = 4


def _require_tokens(block_tokens: int) -> int:
    if isinstance(block_tokens, bool) or not isinstance(block_tokens, int) or block_tokens < 1:
        raise ConfigError(f"block tokens must be an integer >= 1, got {block_tokens!r}")
    return block_tokens


def _require_ring(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ConfigError(f"a ring needs n >= 2 devices (e.g. 2, 4, 8), got {n!r}")
    return n


def hops_per_layer(n: int) -> int:
    return _require_ring(n) - 1


def block_bytes(model: ModelSpec, block_tokens: int) -> int:
    """One layer's K and V of a block: 2 × kv_dim × bytes_per_value per token (docs/reference.md §1)."""
    return _require_tokens(block_tokens) * KV_TENSORS * model.kv_dim * model.bytes_per_value


def block_attention_s(model: ModelSpec, device: Device, block_tokens: int) -> float:
    """One layer's attention of a block's queries on one KV block (module docstring), roofline on one GPU."""
    t = _require_tokens(block_tokens)
    flops = ATTENTION_FLOPS_PER_PAIR_PER_D * model.d_model * t * t
    hbm = (2 * t * model.d_model + KV_TENSORS * t * model.kv_dim) * model.bytes_per_value  # Q and O, K and V
    cost = step_time(StepWork(float(flops), float(hbm)), device, 1)
    return max(cost.compute_s, cost.memory_s)


@dataclass(frozen=True)
class Hop:
    link_s: float  # latency (+ the module's) + max(wire / bw, module compute)
    compute_s: float

    @property
    def total_s(self) -> float:
        return max(self.link_s, self.compute_s)

    @property
    def link_bound(self) -> bool:
        return self.link_s > self.compute_s


def hop(model: ModelSpec, device: Device, link: Link, block_tokens: int, ratio: float = 1.0,
        kernel: KernelDeclaration | None = None, module: Module = Module()) -> Hop:
    """One overlapped hop. `ratio` compresses the block on the wire (no module time); a `kernel` instead runs on
    the module, with its own ratio and transit time (docs/reference.md §5)."""
    nbytes = block_bytes(model, block_tokens)
    compute = block_attention_s(model, device, block_tokens)
    if kernel is not None:
        return Hop(transit_time(nbytes, kernel, link.bandwidth_Bps, link.latency_s, module).total_s, compute)
    if not ratio >= 1:
        raise ConfigError(f"codec ratio must be >= 1, got {ratio!r}")
    return Hop(link.transfer_time_s(nbytes / ratio), compute)


def layer_s(model: ModelSpec, device: Device, link: Link, block_tokens: int, n: int, ratio: float = 1.0,
            kernel: KernelDeclaration | None = None) -> float:
    """The own block's compute, then n − 1 overlapped hops."""
    h = hop(model, device, link, block_tokens, ratio, kernel)
    return h.compute_s + hops_per_layer(n) * h.total_s


def crossover_bandwidth_Bps(model: ModelSpec, device: Device, block_tokens: int, latency_s: float) -> float | None:
    """The bandwidth below which the raw hop is link-bound, so a codec starts to pay: bytes / (compute − latency).

    None when the latency alone exceeds the compute: every bandwidth is link-bound there."""
    spare = block_attention_s(model, device, block_tokens) - latency_s
    if spare <= 0:
        return None
    return block_bytes(model, block_tokens) / spare


def crossover_block_tokens(model: ModelSpec, device: Device, link: Link, max_tokens: int = 1 << 24) -> int | None:
    """The largest block (tokens) whose raw hop is link-bound on `link`, i.e. where a codec still pays; smaller
    blocks are link-bound too (the link leg grows as t, the compute as t²). None if none up to `max_tokens`
    is link-bound (the first is compute-bound already); `max_tokens` if all are."""
    def link_bound(t: int) -> bool:
        return hop(model, device, link, t).link_bound

    if not link_bound(1):
        return None
    if link_bound(max_tokens):
        return max_tokens
    lo, hi = 1, max_tokens  # link_bound(lo), not link_bound(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if link_bound(mid) else (lo, mid)
    return lo


def codec_saving_s(model: ModelSpec, device: Device, link: Link, block_tokens: int, ratio: float) -> float:
    """Time a codec of `ratio` saves per hop (≥ 0; 0 once the raw hop is compute-bound)."""
    return (hop(model, device, link, block_tokens).total_s
            - hop(model, device, link, block_tokens, ratio).total_s)
