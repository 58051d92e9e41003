"""The report's `collectives` block (`--decode-tp N`): each decode TP group's steps as they ran beside the model's,
joined from the decodes' /stats (`tp_group`, agents/decode/tp_steps.py); None without a group.

Figures are model seconds at the run's dilation; bytes are the real all-reduce's at the run's scale. The scale-up
link's busy share is the time the real all-reduces took (compute held → sums back, as measured) over the run's.
"""

from __future__ import annotations

from typing import Any

from kvtransit.model.scenario import Scenario


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def collectives_summary(scenario: Scenario, decodes: list[dict], run_model_s: float) -> dict[str, Any] | None:
    if scenario.decode_tp == 1:
        return None
    groups = [d["tp_group"] | {"decode": d.get("name")} for d in decodes if isinstance(d.get("tp_group"), dict)]
    measured = {k: sum(g["measured"][k] for g in groups) for k in ("step_s", "collective_s", "allreduce_s")}
    model = {k: sum(g["model"][k] for g in groups) for k in ("step_s", "collective_s", "allreduce_s")}
    steps = sum(g["steps"] for g in groups)
    return {
        "size": scenario.decode_tp, "allreduce": scenario.allreduce, "scaleup_link": scenario.scaleup_link,
        # model/decode_plan.py: GroupAllReduce
        "granularity": "step: one real all-reduce a step carries the step's 2·L all-reduces' bytes; the other "
                       "latency terms are held (a 5 µs hop is under this host's cost of a hop)",
        "groups": len(groups), "steps": steps,
        "step_s": {"measured": _ratio(measured["step_s"], steps), "model": _ratio(model["step_s"], steps)},
        "collective_s": {"measured": _ratio(measured["collective_s"], steps),
                         "model": _ratio(model["collective_s"], steps)},
        "collective_share": {"measured": _ratio(measured["collective_s"], measured["step_s"]),
                             "model": _ratio(model["collective_s"], model["step_s"])},
        "scaleup_busy": {"measured": _ratio(measured["allreduce_s"], run_model_s * max(1, len(groups))),
                         "model": _ratio(model["allreduce_s"], run_model_s * max(1, len(groups)))},
        "sums_checked": sum(g["sums_checked"] + g["follower_sums_checked"] for g in groups),
        "late_s": sum(g["late_s"] for g in groups),
        "overrun_steps": sum(g["overrun_steps"] for g in groups),
        "failures": [f"{g['decode']}: {g['failure']}" for g in groups if g.get("failure")],
        "per_group": groups,
    }


def collectives_line(block: dict | None) -> str | None:
    """The block in a line for the run's output; None without a group."""
    if not block:
        return None

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value * 1e3:.3g} ms"

    def pct(value: float | None) -> str:
        return "-" if value is None else f"{value:.1%}"

    share, step = block["collective_share"], block["step_s"]
    line = (f"collectives (decode TP {block['size']}, {block['allreduce']} over {block['scaleup_link']}, one real "
            f"all-reduce a step): share of the step {pct(share['measured'])} measured vs {pct(share['model'])} "
            f"model; step {ms(step['measured'])} vs {ms(step['model'])}; {block['steps']} steps, "
            f"{block['sums_checked']} sums exact, {block['overrun_steps']} steps whose real all-reduce outlasted them")
    if block["failures"]:
        line += f"; FAILED: {'; '.join(block['failures'])}"
    return line
