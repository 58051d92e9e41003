"""The report's `remote_kv` block (`--kv-placement remote`): the long-context class's remote KV as decode fetched it,
beside the model, and what it cost the class's TPOT; None without remote KV.

Joined from decode's /stats (`remote_kv`, flows/selection/decode_legs.py), the middlebox's (the module's scoring) and
the pool's; the class's TPOT is the client's own, split by the pure class rule (flows/selection/remote_class.py:
in_remote_class). Bytes are model bytes (× 1/scale); seconds model seconds. The legs are judged on the steps that had
the link to themselves (no hand-off on it), at the bytes they moved: measured / model (flows/selection/remote_class.py:
legs_model_s).
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any, ClassVar

from kvtransit.flows.selection.section import SelectionSection
from kvtransit.model.cost.energy import link_energy_j, module_energy_j
from kvtransit.model.judge import fidelity
from kvtransit.model.judge.slo import RequestRecord, distribution
from kvtransit.model.scenario import Scenario
from kvtransit.report.blocks import FlowReport, RunData, ms
from kvtransit.report.peer_stats import stat_sum


def _tpot_ms(records: list[RequestRecord]) -> dict[str, float] | None:
    values = [r.tpot_s * 1e3 for r in records if r.tpot_s is not None]
    return distribution(values) if values else None


def remote_kv_summary(scenario: Scenario, records: list[RequestRecord], decodes: list[dict],
                      middleboxes: list[dict], pools: list[dict]) -> dict[str, Any] | None:
    selection = SelectionSection.of(scenario)
    if not selection.remote:
        return None
    stats = [d["remote_kv"] for d in decodes if isinstance(d.get("remote_kv"), dict)]
    step = selection.selection_step(scenario)
    check = selection.scoring_check(scenario)
    request_steps = sum(s["request_steps"] for s in stats)
    steps = sum(s["steps"] for s in stats)
    long = [r for r in records if selection.is_remote_request(scenario, r.request_id)]
    short = [r for r in records if not selection.is_remote_request(scenario, r.request_id)]
    ratios = [s["ratio_median"] for s in stats if s.get("ratio_median") is not None]
    return {
        "select": selection.select_mode, "budget": step.budget, "summary": selection.select_summary,
        "page_size": selection.page_size, "context_tokens": selection.remote_context,
        "share": selection.remote_share,
        "scoring": None if check is None else check.describe(),
        "requests": {"remote": len(long), "local": len(short)},
        "tpot_ms": {"remote": _tpot_ms(long), "local": _tpot_ms(short)},
        "steps": steps,
        "idle_link_steps": sum(s["idle_link_steps"] for s in stats),
        # Per remote request and step, what crossed the decode link (the model's: flows/selection/model.py).
        "summary_bytes": {"measured": sum(s["summary_bytes"] for s in stats) / request_steps if request_steps
                          else None, "model": step.summary_bytes},
        "page_bytes": {"measured": sum(s["page_bytes"] for s in stats) / request_steps if request_steps else None,
                       "model": step.chosen_kv_bytes if step.budget is not None else step.all_kv_bytes},
        "reduction_vs_all": step.reduction,
        "legs_s": {"measured": sum(s["legs_seconds"] for s in stats) / steps if steps else None,
                   "model": sum(s["model_seconds"] for s in stats) / steps if steps else None},
        # The worst decode's median over its idle-link steps, and p99 (measured / model at the bytes moved).
        "legs_ratio_median": max(ratios, key=lambda r: abs(r - 1)) if ratios else None,
        "legs_ratio_p99": max((s["ratio_p99"] for s in stats if s.get("ratio_p99") is not None), default=None),
        "late_s": sum(s["late_s"] for s in stats),
        "scored_bytes": sum(m.get("remote_kv", {}).get("scored_bytes", 0.0) for m in middleboxes),
        "made_on_demand": sum(p.get("remote_kv", {}).get("made_on_demand", 0) for p in pools),
        "failures": {k: v for s in stats for k, v in s["failures"].items()},
        "shared_handoffs": sum(len(s.get("shared_handoffs", [])) for s in stats),
    }


def shared_handoffs(decodes: list[dict]) -> set[int]:
    """Request ids of hand-offs that met remote legs on the link (not on an idle link, for the hand-off check)."""
    return {rid for d in decodes for rid in (d.get("remote_kv") or {}).get("shared_handoffs", [])}


def remote_kv_line(block: dict | None) -> list[str]:
    if not block:
        return []

    def ms(seconds: float | None) -> str:
        return "-" if seconds is None else f"{seconds * 1e3:.3g} ms"

    def mb(nbytes: float | None) -> str:
        return "-" if nbytes is None else f"{nbytes / 1e6:.4g} MB"

    tpot = block["tpot_ms"]
    remote, local = (f"{t['p50']:.3g}" if t else "-" for t in (tpot["remote"], tpot["local"]))
    what = (f"top-k {block['budget']:.4g} of {block['summary']} pages" if block["select"] == "top-k"
            else "every token")
    ratio = block["legs_ratio_median"]
    median = "-" if ratio is None else f"{ratio:.3f}"
    legs, summaries, pages = block["legs_s"], block["summary_bytes"], block["page_bytes"]
    return [(f"remote KV ({what}, {block['context_tokens']}-token contexts, {block['requests']['remote']} remote "
             f"requests): a step's legs {ms(legs['measured'])} (model {ms(legs['model'])}; idle-link median "
             f"x{median}), per request-step {mb(summaries['measured'])} of summaries + {mb(pages['measured'])} of "
             f"pages; TPOT p50 remote {remote} ms vs local {local} ms")]


def remote_kv_gaps(decodes: list[dict], scenario: Scenario) -> dict[str, fidelity.Gap]:
    what = "remote KV legs on an idle link"
    judged = {s.get("name", "decode"): s["remote_kv"] for s in decodes if isinstance(s.get("remote_kv"), dict)}
    if not judged:
        return {"remote_kv_decode": fidelity.not_measured("no decode reported its remote KV", fidelity.GROUP_TOLERANCE)}
    # Under --scale auto a higher dilation buys bigger payloads, not time: a step's legs are a few ms of link
    # whatever the dilation, and their host time (8 hops, the scoring, the ranking) grows with the bytes. A fixed
    # scale turns the dilation into headroom (measured on this 2-core box with a slow page gather: at 1/256 x1.22 at
    # dilation 1 and x1.005 at 2; under auto, dilation 2 made it 1/32 and still x1.2-1.4).
    fixed_scale = (str(Fraction(scenario.kv_layout.channels, scenario.model_spec.kv_dim))
                   if isinstance(scenario.scale, str) else None)
    return {f"remote_kv_{name}": (fidelity.model_gap(r["ratio_median"], 1.0, scenario.effective_dilation, what,
                                                     fixed_scale=fixed_scale)
                                  if r.get("idle_link_steps") else
                                  fidelity.not_measured(f"{name}: no step's remote legs had the link to themselves",
                                                        fidelity.GROUP_TOLERANCE))
            for name, r in judged.items()}


def remote_kv_energy_j(scenario: Scenario, middleboxes: list[dict]) -> float | None:
    """Remote KV's energy (--kv-placement remote): its summaries and pages over the decode link (its pJ per wire bit),
    plus the module's for the summaries it scored (pJ per input bit). None without remote KV. Model bytes, from the
    middlebox's relay (it stamped every byte onto the link)."""
    relays = [m["remote_kv"] for m in middleboxes if isinstance(m.get("remote_kv"), dict)]
    if not SelectionSection.of(scenario).remote or not relays:
        return None
    crossed = stat_sum(relays, "summary_bytes") + stat_sum(relays, "page_bytes")
    return (link_energy_j(scenario.link_spec, crossed)
            + module_energy_j(scenario.module, stat_sum(relays, "scored_bytes")))


class SelectionReport(FlowReport):
    KEY = "remote_kv"
    ENERGY: ClassVar[Mapping[str, str]] = {"remote_kv": "remote KV"}

    def block(self, run: RunData) -> dict[str, Any] | None:
        """The long-context class's remote legs beside the model, its TPOT (None without remote KV)."""
        return remote_kv_summary(run.scenario, list(run.records), list(run.decodes), list(run.middleboxes),
                                 run.of_role("kvpool"))

    def energy(self, run: RunData) -> dict[str, float | None]:
        return {"remote_kv": remote_kv_energy_j(run.scenario, list(run.middleboxes))}

    def fidelity(self, run: RunData) -> dict[str, fidelity.Gap]:
        if not SelectionSection.of(run.scenario).remote:
            return {}
        return remote_kv_gaps(list(run.decodes), run.scenario)

    def not_idle(self, run: RunData) -> set[int]:
        return shared_handoffs(list(run.decodes))  # met remote KV's legs on the link

    def lines(self, report: Mapping[str, Any]) -> list[str]:
        return remote_kv_line(report.get(self.KEY))

    def columns(self, report: Mapping[str, Any]) -> dict[str, Any]:
        """Remote KV's headline figures (extra CSV columns), for runs with --kv-placement remote (the sweep axes
        `--grid select=top-k,all --grid select_budget=0.25,0.125,0.0625`)."""
        block = report.get("remote_kv")
        if not block:
            return {}
        tpot = block["tpot_ms"]
        return {"select": block["select"], "select_budget": block["budget"],
                "remote_legs_ms": ms(block["legs_s"]["measured"]), "model_remote_legs_ms": ms(block["legs_s"]["model"]),
                "remote_bytes_per_step": ((block["summary_bytes"]["measured"] or 0)
                                          + (block["page_bytes"]["measured"] or 0)),
                "remote_tpot_p50_ms": tpot["remote"]["p50"] if tpot["remote"] else None,
                "local_tpot_p50_ms": tpot["local"]["p50"] if tpot["local"] else None}


REPORT = SelectionReport()
