"""The report's `collectives` block (`--prefill-tp` / `--decode-tp N`): each role's TP groups' steps as they ran
beside the model's, joined from the leaders' /stats (`tp_group`, flows/tp/group/steps.py): `{"prefill": …,
"decode": …}`, a role without groups None; the block None when neither has one.

Figures are model seconds at the run's dilation; bytes are the real all-reduce's at the run's scale. The scale-up
link's busy share is the time the real all-reduces took (compute held → sums back, as measured) over the run's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvtransit.flows.tp.section import TpSection
from kvtransit.model.judge import fidelity
from kvtransit.model.scenario import Scenario
from kvtransit.report.blocks import FlowReport, RunData, ms


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def collectives_summary(scenario: Scenario, prefills: list[dict], decodes: list[dict],
                        run_model_s: float) -> dict[str, Any] | None:
    if scenario.prefill_tp == 1 and scenario.decode_tp == 1:
        return None
    return {"prefill": _role_summary(scenario, "prefill", scenario.prefill_tp, prefills, run_model_s),
            "decode": _role_summary(scenario, "decode", scenario.decode_tp, decodes, run_model_s)}


def _role_summary(scenario: Scenario, role: str, size: int, leaders: list[dict],
                  run_model_s: float) -> dict[str, Any] | None:
    tp_section = TpSection.of(scenario)
    if size == 1:
        return None
    groups = [s["tp_group"] | {"leader": s.get("name")} for s in leaders if isinstance(s.get("tp_group"), dict)]
    measured = {k: sum(g["measured"][k] for g in groups) for k in ("step_s", "collective_s", "allreduce_s")}
    model = {k: sum(g["model"][k] for g in groups) for k in ("step_s", "collective_s", "allreduce_s")}
    steps = sum(g["steps"] for g in groups)
    return {
        "size": size, "parallelism": "ep" if role == "decode" and tp_section.decode_ep else "tp",
        "allreduce": tp_section.allreduce, "scaleup_link": tp_section.scaleup_link,
        # flows/tp/group_step.py: live_collectives
        "granularity": "step: one real all-reduce a step carries the step's all-reduces' bytes (and with EP one "
                       "real all-to-all its all-to-alls'); the other latency terms are held (a 5 µs hop is under this "
                       "host's cost of a hop)",
        "groups": len(groups), "steps": steps,
        "step_s": {"measured": _ratio(measured["step_s"], steps), "model": _ratio(model["step_s"], steps)},
        # Each step's measured / modelled time (the mean above telescopes: steps are on absolute deadlines), the
        # worst group's.
        "step_ratio_p99": max((g["step_ratio"]["p99"] for g in groups if g.get("step_ratio", {}).get("p99")),
                              default=None),
        "collective_s": {"measured": _ratio(measured["collective_s"], steps),
                         "model": _ratio(model["collective_s"], steps)},
        "collective_share": {"measured": _ratio(measured["collective_s"], measured["step_s"]),
                             "model": _ratio(model["collective_s"], model["step_s"])},
        "scaleup_busy": {"measured": _ratio(measured["allreduce_s"], run_model_s * max(1, len(groups))),
                         "model": _ratio(model["allreduce_s"], run_model_s * max(1, len(groups)))},
        "sums_checked": sum(g["sums_checked"] + g["follower_sums_checked"] for g in groups),
        "alltoalls_checked": sum(g.get("alltoalls_checked", 0) for g in groups),
        "late_s": sum(g["late_s"] for g in groups),
        "overrun_steps": sum(g["overrun_steps"] for g in groups),
        "failures": [f"{g['leader']}: {g['failure']}" for g in groups if g.get("failure")],
        "per_group": groups,
    }


def collectives_lines(block: dict | None) -> list[str]:
    """The block in a line a role for the run's output; none without a group."""
    return [_line(role, summary) for role, summary in (block or {}).items() if summary]


def _line(role: str, block: dict) -> str:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value * 1e3:.3g} ms"

    def pct(value: float | None) -> str:
        return "-" if value is None else f"{value:.1%}"

    share, step = block["collective_share"], block["step_s"]
    group = f"EP = TP {block['size']}" if block.get("parallelism") == "ep" else f"TP {block['size']}"
    real = "all-reduce and all-to-all" if block.get("parallelism") == "ep" else "all-reduce"
    busy = block["scaleup_busy"]
    line = (f"collectives ({role} {group}, {block['allreduce']} over {block['scaleup_link']}, one real {real} a "
            f"step): share of the step {pct(share['measured'])} measured vs {pct(share['model'])} model; step "
            f"{ms(step['measured'])} vs {ms(step['model'])}; {block['scaleup_link']} busy {pct(busy['measured'])} "
            f"(model {pct(busy['model'])}); {block['steps']} steps, {block['sums_checked']} sums exact, "
            f"{block['overrun_steps']} steps whose real collectives outlasted them")
    if block["failures"]:
        line += f"; FAILED: {'; '.join(block['failures'])}"
    return line


def collective_gaps(role: str, leaders: list[dict], dilation: float) -> dict[str, fidelity.Gap]:
    groups = {s.get("name", role): s["tp_group"] for s in leaders if isinstance(s.get("tp_group"), dict)}
    if not groups:
        return {f"collectives_{role}": fidelity.not_measured(f"no {role} reported its TP group",
                                                             fidelity.COLLECTIVE_SHARE_TOLERANCE)}
    return {f"collectives_{name}": fidelity.collective_gap(g.get("measured_collective_share"),
                                                           g.get("model_collective_share"), dilation, g.get("failure"))
            for name, g in groups.items()}




class TpReport(FlowReport):
    KEY = "collectives"

    def block(self, run: RunData) -> dict[str, Any] | None:
        """Each TP group's collective time beside the model's (None without one)."""
        return collectives_summary(run.scenario, list(run.prefills), list(run.decodes), run.run_model_s)

    def fidelity(self, run: RunData) -> dict[str, fidelity.Gap]:
        scenario, gaps = run.scenario, {}
        dilation = scenario.effective_dilation
        if scenario.prefill_tp > 1:
            gaps.update(collective_gaps("prefill", list(run.prefills), dilation))
        if scenario.decode_tp > 1:
            gaps.update(collective_gaps("decode", list(run.decodes), dilation))
        return gaps

    def lines(self, report: Mapping[str, Any]) -> list[str]:
        return collectives_lines(report.get(self.KEY))

    def columns(self, report: Mapping[str, Any]) -> dict[str, Any]:
        """TP groups' headline figures (extra CSV columns, a role's prefixed by it), for runs with --prefill-tp or
        --decode-tp > 1 (the sweep axes `--grid decode_tp=1,4,8 --grid allreduce=ring,switch`)."""
        columns: dict = {}
        for role, block in (report.get("collectives") or {}).items():
            if block:
                columns |= {f"{role}_tp": block["size"], "allreduce": block["allreduce"],
                            f"{role}_collective_share": block["collective_share"]["measured"],
                            f"{role}_model_collective_share": block["collective_share"]["model"],
                            f"{role}_tp_step_ms": ms(block["step_s"]["measured"]),
                            f"{role}_model_tp_step_ms": ms(block["step_s"]["model"])}
        return columns


REPORT = TpReport()
