"""What the hardware would need: each flow's break-even module (`kvtransit candidates --spec`).

For one event of a flow (a hand-off, an all-reduce, a decode step's scoring, a ring hop, a key switch), three ways to
spend on it:
- **in transit**: the kernel on the module, docs/reference.md §5.3's transit time `latency + module latency +
  max(wire / bw, ops / (budget × bw))` and energy `module pJ × input bits (+ the far end's decode) + link pJ × wire
  bits`;
- **the same kernel on the GPU** (the codec at the GPU, the sum by the GPUs' ring, the scores computed by the host
  that fetched the summaries), over the same link: model/cost/gpu_codec.py's roofline work, energy by
  model/cost/energy.py;
- **the next faster link** (`FASTER_LINKS`: the catalogue's next rung up) with no kernel in transit.

The break-even module is, one figure at a time with the others at the simulator's stage (1.6 ops per line byte,
1 pJ per input bit, 1 µs; docs/reference.md §5.3): the least **ops per line byte** (and never less than the kernel's
own, below which it is transit-bound), the most **pJ per input bit** and the most **added latency** at which the
event in transit is no slower and costs no more energy than the better of the other two ("at equal power": the
module's joules must come out of what the alternative spends), and the **precision bits** the flow's arithmetic or
its measured task-level loss needs. "none" says no value of that figure does it, and why (a ratio too small to beat
a faster link's bandwidth; a kernel whose wire alone outlasts the alternative). Pure arithmetic over the flows' own
models; the figures it reads are the model's (and, where said, a committed measurement).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kvtransit.model.catalog.devices import device_by_name
from kvtransit.model.catalog.links import LINKS, Link, link_by_name
from kvtransit.model.cost.energy import gpu_energy_j, handoff_module_energy_j, link_energy_j
from kvtransit.model.errors import ConfigError
from kvtransit.model.module.budget import (
    SIM_ADDED_LATENCY_S,
    SIM_OPS_PER_LINE_BYTE,
    SIM_PJ_PER_INPUT_BIT,
    KernelDeclaration,
    Module,
    transit_time,
)

# The links a flow could move to instead of a kernel, slowest first (docs/reference.md §2, §7.4): the deck's
# hand-off links, then NVLink 5 above NVLink 4 for the scale-up flows. PCIe (a GPU to its host) and qsfp56 (the
# module's own line rate, no latency or energy of its own) are no alternative to a kernel on a network link.
FASTER_LINKS = ("eth-25g", "eth-100g", "ib-ndr", "nvlink4", "nvlink5")
DEVICE = "h100"  # the modelled accelerator every row's compute is held at (docs/reference.md §3.5)
BUDGET_SEARCH = (1e-3, 1e6)  # ops per line byte the break-even search spans (far beyond docs/reference.md §5.3's range)


def next_faster(link: str) -> str | None:
    """The next rung of FASTER_LINKS above `link`'s bandwidth (None: nothing faster in the catalogue)."""
    bw = link_by_name(link).bandwidth_Bps
    faster = [LINKS[n] for n in FASTER_LINKS if LINKS[n].bandwidth_Bps > bw]
    return min(faster, key=lambda k: k.bandwidth_Bps).name if faster else None


@dataclass(frozen=True)
class SpecCase:
    """One flow's event, priced three ways (module docstring). `transit_s(budget, latency_s)` and
    `transit_j(pj_per_bit)`: the event in transit on a module of that budget, latency or energy; `gpu_*` and
    `faster_*`: the alternatives (None: not modelled, said in `*_what`)."""

    event: str
    link: str
    kernel: str
    ratio: float
    ops_per_line_byte: float  # the least budget at which the kernel is not transit-bound (the budget test)
    unpublished: tuple[str, ...]  # ops it needs that the module does not publish
    transit_s: Callable[[float, float], float]
    transit_j: Callable[[float], float]
    gpu_s: float | None
    gpu_j: float | None
    gpu_what: str
    faster: str | None
    faster_s: float | None
    faster_j: float | None
    bits: str  # the precision bits the flow needs, in words
    note: str = ""
    no_kernel: str | None = None  # the row's kernel is the identity: nothing to price


@dataclass(frozen=True)
class BreakEven:
    flow: str
    case: SpecCase
    target_s: float | None  # the better alternative's time
    target_j: float | None
    beaten_by: str  # which alternative sets the target
    ops_per_line_byte: float | None  # least budget (None: none does)
    pj_per_bit: float | None  # most module energy (None: none)
    latency_s: float | None  # most added latency (None: none)
    why_none: dict[str, str]
    at_sim: bool | None  # does the simulator's stage (1.6, 1 pJ, 1 µs) beat both?

    def as_dict(self) -> dict[str, Any]:
        c = self.case
        return {"flow": self.flow, "event": c.event, "link": c.link, "kernel": c.kernel, "ratio": c.ratio,
                "faster_link": c.faster, "unpublished_ops": list(c.unpublished),
                "in_transit_at_sim_s": c.transit_s(SIM_OPS_PER_LINE_BYTE, SIM_ADDED_LATENCY_S),
                "gpu_s": c.gpu_s, "gpu_j": c.gpu_j, "faster_s": c.faster_s, "faster_j": c.faster_j,
                "target_s": self.target_s, "target_j": self.target_j, "set_by": self.beaten_by,
                "ops_per_line_byte": self.ops_per_line_byte, "pj_per_bit": self.pj_per_bit,
                "latency_s": self.latency_s, "precision_bits": c.bits, "why_none": self.why_none,
                "at_sim": self.at_sim, "note": c.note, "no_kernel": c.no_kernel}


def _least(values: list[tuple[float | None, str]]) -> tuple[float | None, str]:
    known = [(v, what) for v, what in values if v is not None]
    return min(known) if known else (None, "nothing modelled")


def break_even(flow: str, case: SpecCase) -> BreakEven:
    """The break-even module for `case` (module docstring)."""
    if case.no_kernel is not None:
        return BreakEven(flow, case, None, None, "-", None, None, None, {"all": case.no_kernel}, None)
    target_s, by_s = _least([(case.gpu_s, "the GPU"), (case.faster_s, f"{case.faster} (no kernel)")])
    target_j, _ = _least([(case.gpu_j, "the GPU"), (case.faster_j, "the faster link")])
    why: dict[str, str] = {}
    ops = latency = pj = None
    if target_s is not None:
        wire_only = case.transit_s(BUDGET_SEARCH[1], 0.0)
        if wire_only > target_s:
            why["ops"] = why["latency"] = (f"its wire alone ({wire_only * 1e3:.4g} ms) outlasts {by_s} "
                                           f"({target_s * 1e3:.4g} ms)" + _ratio_needed(case))
        else:
            lo, hi = max(BUDGET_SEARCH[0], case.ops_per_line_byte), BUDGET_SEARCH[1]
            if case.transit_s(lo, SIM_ADDED_LATENCY_S) <= target_s:
                ops = lo
            elif case.transit_s(hi, SIM_ADDED_LATENCY_S) > target_s:
                why["ops"] = "the simulator's 1 µs of added latency alone loses"
            else:
                for _ in range(80):  # bisection in log space: the event's time falls as the budget grows
                    mid = math.sqrt(lo * hi)
                    lo, hi = (lo, mid) if case.transit_s(mid, SIM_ADDED_LATENCY_S) <= target_s else (mid, hi)
                ops = hi
            spare = target_s - case.transit_s(SIM_OPS_PER_LINE_BYTE, 0.0)
            if spare >= 0:  # the most added latency still in time (a hop's compute can hide some: bisect)
                lo_t, hi_t = 0.0, spare + target_s
                for _ in range(80):
                    mid = (lo_t + hi_t) / 2
                    lo_t, hi_t = (mid, hi_t) if case.transit_s(SIM_OPS_PER_LINE_BYTE, mid) <= target_s else (lo_t, mid)
                latency = lo_t
            else:
                why["latency"] = (f"at {SIM_OPS_PER_LINE_BYTE:g} ops/line B it is {-spare * 1e6:.3g} µs slower than "
                                  f"{by_s} before any added latency")
    else:
        why["ops"] = why["latency"] = "no alternative's time modelled"
    if target_j is not None:
        base, per_pj = case.transit_j(0.0), case.transit_j(1.0) - case.transit_j(0.0)
        pj = (target_j - base) / per_pj if per_pj > 0 else None
        if pj is None or pj < 0:
            pj = None
            why["pj"] = (f"its link energy alone ({base:.3g} J) exceeds the alternative's ({target_j:.3g} J)"
                         if base > target_j else "no module energy to price")
    else:
        why["pj"] = "no alternative's energy modelled"
    found = BreakEven(flow, case, target_s, target_j, by_s, ops, pj, latency, why, None)
    at_sim = None if target_s is None else meets(found, ModuleSpec()) == "yes"
    return replace(found, at_sim=at_sim)


def _ratio_needed(case: SpecCase) -> str:
    if case.faster is None or case.ratio <= 0:
        return ""
    need = LINKS[case.faster].bandwidth_Bps / LINKS[case.link].bandwidth_Bps
    return f"; its ratio {case.ratio:.3g} would have to reach ~{need:.3g} (the faster link's bandwidth over this one's)"


@dataclass(frozen=True)
class ModuleSpec:
    """A module to hold against the sheet (`kvtransit candidates --spec` with --module-budget, --module-pj-per-bit,
    --module-latency-us, --precision-bits): each figure checked, one line naming a bad one."""

    ops_per_line_byte: float = SIM_OPS_PER_LINE_BYTE
    pj_per_bit: float = SIM_PJ_PER_INPUT_BIT
    latency_s: float = SIM_ADDED_LATENCY_S
    precision_bits: int | None = None

    def __post_init__(self) -> None:
        for value, flag in ((self.ops_per_line_byte, "--module-budget"), (self.pj_per_bit, "--module-pj-per-bit"),
                            (self.latency_s, "--module-latency-us")):
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise ConfigError(f"{flag} must be a number >= 0, got {value!r}")
        if self.ops_per_line_byte == 0:
            raise ConfigError("--module-budget must be a number of ops per line byte > 0, got 0")


def meets(be: BreakEven, module: ModuleSpec) -> str:
    """Whether `module` reaches the break-even on every figure: "yes", or which figures fall short."""
    if be.case.no_kernel is not None:
        return "-"
    short = []
    if be.case.unpublished:
        short.append(f"needs {', '.join(be.case.unpublished)}")
    if be.ops_per_line_byte is None or module.ops_per_line_byte < be.ops_per_line_byte:
        short.append("ops")
    if (be.pj_per_bit is None and be.target_j is not None) or (be.pj_per_bit is not None
                                                                and module.pj_per_bit > be.pj_per_bit):
        short.append("pJ/bit")  # (no energy modelled for the alternative: not held against the module)
    if be.latency_s is None or module.latency_s > be.latency_s:
        short.append("latency")
    bits = _bits_needed(be.case.bits)
    if module.precision_bits is not None and (bits is None or module.precision_bits < bits):
        short.append("precision bits")
    return "yes" if not short else "no (" + ", ".join(short) + ")"


def _bits_needed(text: str) -> int | None:
    """The least analogue bits a case's `bits` text asks (None: none will do, or exact)."""
    import re

    m = re.match(r"\s*(?:>=\s*)?(\d+)", text)
    return int(m.group(1)) if m else None


# --- the cases, one shape per kind of kernel -------------------------------------------------------------------

def _link_j(link: Link, nbytes: float) -> float:
    return link_energy_j(link, nbytes)


def codec_case(event: str, model_name: str, tokens: int, link_name: str, *, codec: str = "freq-keep-k",
               input_bytes: float | None = None, bits_from: Path | None = None, overlap_s: float = 0.0,
               kernel_note: str = "") -> SpecCase:
    """A codec on a link carrying `tokens` tokens of `model_name`'s KV (or `input_bytes` of activations): in transit
    (encode, and the far end's decode, docs/reference.md §5.5), at the GPU (model/cost/gpu_codec.py's forward and
    inverse, fused), or no codec on the next faster link. `overlap_s`: compute the event hides behind (a ring hop's
    attention: the event takes max(link, compute))."""
    from kvtransit.model.catalog.codecs import codec_declaration
    from kvtransit.model.catalog.models import model_by_name
    from kvtransit.model.cost.gpu_codec import forward_work, fused_s, inverse_work

    model, device, link = model_by_name(model_name), device_by_name(DEVICE), link_by_name(link_name)
    decl = replace(codec_declaration(codec), transform_charged=False)  # the simulator's passive optics
    nbytes = float(model.kv_bytes(tokens)) if input_bytes is None else input_bytes
    wire = nbytes / decl.ratio
    scale = nbytes / model.kv_bytes(tokens) if input_bytes is not None else 1.0
    fwd, inv = forward_work(decl, model, tokens), inverse_work(decl, model, tokens)
    gpu_s = (fused_s(fwd, device, 1) + fused_s(inv, device, 1)) * scale
    gpu_j = (gpu_energy_j(device, fwd.flops, fwd.hbm_bytes) + gpu_energy_j(device, inv.flops, inv.hbm_bytes)) * scale
    faster_name = next_faster(link_name)

    def transit_s(budget: float, latency_s: float) -> float:
        t = transit_time(int(nbytes), decl, link.bandwidth_Bps, link.latency_s,
                         Module(ops_per_byte=budget, added_latency_s=latency_s)).total_s
        return max(t, overlap_s)

    def transit_j(pj: float) -> float:
        return handoff_module_energy_j(Module(pj_per_input_bit=pj), nbytes, wire) + _link_j(link, wire)

    faster = link_by_name(faster_name) if faster_name else None
    return SpecCase(
        event, link_name, decl.name, decl.ratio, decl.charged_ops_per_byte * decl.ratio,
        tuple(sorted(decl.unpublished_ops)), transit_s, transit_j,
        max(link.transfer_time_s(wire), overlap_s + gpu_s), gpu_j + _link_j(link, wire),
        "the same codec on the GPU (forward at the sender, inverse at the receiver, fused; model/cost/gpu_codec.py)",
        faster_name, None if faster is None else max(faster.transfer_time_s(nbytes), overlap_s),
        None if faster is None else _link_j(faster, nbytes),
        _codec_bits(codec, bits_from), note=kernel_note)


def _codec_bits(codec: str, results: Path | None) -> str:
    """The least analogue bits at which the codec's measured task-level loss is within tolerance (accuracy.json)."""
    if codec != "freq-keep-k" or results is None or not results.exists():
        return "exact (its rounding is the kernel's, not the analogue path's)" if codec != "freq-keep-k" else "-"
    import json

    from kvtransit.model.judge.task_accuracy import PPL_INCREASE_TOLERANCE, codec_key, task_loss_from_results

    data = json.loads(results.read_text())
    found = []
    for bits in (None, *range(4, 13)):
        loss = task_loss_from_results(data, codec_key(codec, keep=0.5, block=64, sinks=4, variant="dct",
                                                      precision_bits=bits), where=results.name)
        if loss is not None:
            found.append((bits, loss.ppl_increase))
    within = [b for b, inc in found if inc <= PPL_INCREASE_TOLERANCE]
    if within:
        least = min((b for b in within if b is not None), default=None)
        return "exact" if least is None else f">= {least}"
    exact = next((inc for b, inc in found if b is None), None)
    return (f"none: the kernel's own loss (+{exact:.0%} perplexity, exact analogue path) is past +"
            f"{PPL_INCREASE_TOLERANCE:.0%}" if exact is not None else "-")


def modular_case(event: str, decl: KernelDeclaration, input_bytes: float, link_name: str, *, other_s: float | None,
                 other_j: float | None, other_what: str, bits: str, extra_hbm_bytes: float = 0.0,
                 note: str = "") -> SpecCase:
    """A modular kernel on ciphertext bytes that cross anyway (a key switch, ML-KEM's NTTs): in transit the
    endpoint's work on them disappears; at the GPU (the modelled accelerator, one op a FLOP: optimistic for 64-bit
    modular arithmetic) or at `other_s` (a measured host figure) it stays; on the next faster link too."""
    device, link = device_by_name(DEVICE), link_by_name(link_name)
    ops = input_bytes * decl.charged_ops_per_byte
    from kvtransit.model.cost.roofline import StepWork, step_time

    t = step_time(StepWork(ops, input_bytes * 2 + extra_hbm_bytes), device, 1)
    gpu_s = max(t.compute_s, t.memory_s) if other_s is None else other_s
    gpu_j = gpu_energy_j(device, ops, input_bytes * 2 + extra_hbm_bytes) if other_s is None else other_j
    faster_name = next_faster(link_name)
    faster = link_by_name(faster_name) if faster_name else None
    on_line = decl if decl.ratio == 1 else KernelDeclaration(decl.name, ratio=1.0, ops_per_byte=decl.ops_per_byte,
                                                              op_types=decl.op_types)

    def transit_s(b: float, latency_s: float) -> float:
        return transit_time(int(input_bytes), on_line, link.bandwidth_Bps, link.latency_s,
                            Module(ops_per_byte=b, added_latency_s=latency_s)).total_s

    def transit_j(pj: float) -> float:
        return _link_j(link, input_bytes) + Module(pj_per_input_bit=pj).energy_j(input_bytes)

    what = other_what if other_s is not None else "the same work on the modelled GPU (h100 roofline, one op a FLOP)"
    return SpecCase(event, link_name, decl.name, decl.ratio, decl.charged_ops_per_byte,
                    tuple(sorted(decl.unpublished_ops)), transit_s, transit_j,
                    link.transfer_time_s(input_bytes) + gpu_s,
                    None if gpu_j is None else _link_j(link, input_bytes) + gpu_j, what, faster_name,
                    None if faster is None else faster.transfer_time_s(input_bytes) + gpu_s,
                    None if faster is None or gpu_j is None else _link_j(faster, input_bytes) + gpu_j, bits,
                    note=note)


def no_kernel_case(event: str, link_name: str, kernel: str, why: str) -> SpecCase:
    return SpecCase(event, link_name, kernel, 1.0, 0.0, (), lambda b, t: math.nan, lambda p: math.nan, None, None,
                    "-", next_faster(link_name), None, None, "-", no_kernel=why)


def spec_sheet(rows: dict[str, Any]) -> list[BreakEven]:
    """Every row's break-even module, in table order (rows without a spec are left out)."""
    out = []
    for name, row in rows.items():
        if row.spec is None:
            continue
        try:
            out.append(break_even(name, row.spec()))
        except ConfigError as exc:
            raise ConfigError(f"spec for {name}: {exc}") from None
    return out
