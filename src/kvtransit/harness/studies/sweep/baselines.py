"""Baselines at equal power (the deck's last ask): is a kernel in transit worth its module, against
the two other ways to spend on the same hand-off?

- **kernel in transit**: the scenario as given (its codec on the link, `compress_at="transit"`);
- **kernel at the GPU**: the same codec, run on the GPU before the KV leaves it (`compress_at="gpu"`), same link;
- **next faster link**: no codec, the next faster link of the catalogue, everything else equal (the money spent
  on the module spent on a faster link instead).

`compare_at_equal_power` puts the three runs' reports side by side: energy per request (link + module + GPU
[+ pool] joules over the requests that finished), E2E, TTFT and hand-off latency, SLO attainment, faithfulness
and the scale/dilation each was measured at, and which wins. It fails closed: a comparison resting on a run
that was not faithful (or that lacks a figure) says so and names no winner for the kernel.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from typing import Any

from kvtransit.model.catalog.links import LINKS, link_by_name
from kvtransit.model.errors import ConfigError
from kvtransit.model.judge.five_tests import E2E_RESOLUTION
from kvtransit.model.scenario import AUTO, Scenario

IN_TRANSIT = "kernel in transit"
AT_GPU = "kernel at the GPU"
FASTER_LINK = "next faster link"
BASELINES = (IN_TRANSIT, AT_GPU, FASTER_LINK)

# Latency is judged on the mean E2E (model seconds): the figure a faster hand-off moves for every request, and
# steadier than a p99 over the few dozen requests a point on this host runs. The p99s are in the table.
LATENCY_FIGURE = "e2e_mean_s"
# Two runs closer than this are a tie: the emulator's own error band on a request's E2E (step timers 3 % +
# hand-off 2 %, model/judge/five_tests.py E2E_RESOLUTION). Energy per request is held to the same band: it is mostly
# the GPU's step energy, whose steps follow the measured timeline.
RESOLUTION = E2E_RESOLUTION
TIE = "tie: "


# The links a hand-off from one instance to another can cross (docs/reference.md §2, the deck's link study: Ethernet,
# InfiniBand, NVLink). pcie4/pcie5 carry KV between a GPU and its own host (the KV tier), and qsfp56 is only the
# module's line rate (no latency, no energy per bit: as "the faster link" it would win on energy by costing
# nothing): neither is an alternative to a kernel on the hand-off's link.
HANDOFF_LINKS = ("eth-25g", "eth-100g", "ib-ndr", "nvlink4")


def next_faster_link(name: str) -> str | None:
    """The hand-off link (HANDOFF_LINKS) with the smallest bandwidth above `name`'s. None for the fastest
    (nvlink4): there is nothing faster."""
    bandwidth = link_by_name(name).bandwidth_Bps
    faster = [LINKS[n] for n in HANDOFF_LINKS if LINKS[n].bandwidth_Bps > bandwidth]
    return min(faster, key=lambda link: link.bandwidth_Bps).name if faster else None


def faster_link_or_error(name: str) -> str:
    faster = next_faster_link(name)
    if faster is None:
        raise ConfigError(f"baselines: link {name!r} is the fastest in the catalogue: there is no faster link to "
                          "compare the kernel with (choose a slower --link)")
    return faster


def baseline_scenarios(scenario: Scenario, *, emulation: dict[str, float] | None = None) -> dict[str, Scenario]:
    """The three runs to compare, keyed by BASELINES. Each keeps its emulation by the scenario's own rule:
    `scale="auto"` is re-derived for each link; a fixed scale is the preset's for the faster link
    (`emulation`, default `sweep_plan.preset_emulation(faster link)`), which may be a smaller scale or a larger
    dilation: each report says what it was measured at."""
    if scenario.codec == "none":
        raise ConfigError("baselines: codec 'none' has no kernel to compare; give the codec the module would run "
                          "(e.g. --codec freq-keep-k)")
    faster = faster_link_or_error(scenario.link)
    if emulation is None and scenario.scale != AUTO:
        from kvtransit.harness.studies.sweep.plan import (
            preset_emulation,  # sweep_plan builds its `baselines` preset from this module
        )

        emulation = preset_emulation(faster, scenario.model)
    faster_fields: dict[str, Any] = dict(emulation) if emulation is not None else {}
    return {
        IN_TRANSIT: scenario.replace(compress_at="transit"),
        AT_GPU: scenario.replace(compress_at="gpu"),
        FASTER_LINK: scenario.replace(codec="none", compress_at="transit", link=faster, **faster_fields),
    }


# --- recognising the three reports -------------------------------------------------------------------------

def baseline_of(config: dict[str, Any]) -> str:
    """Which baseline a report's `config` block is: codec none → the faster link; else where the codec ran."""
    codec, where = config.get("codec"), config.get("compress_at")
    if codec == "none":
        return FASTER_LINK
    if where == "transit":
        return IN_TRANSIT
    if where == "gpu":
        return AT_GPU
    raise ConfigError(f"baselines: a report with codec {codec!r} at {where!r} is none of: {', '.join(BASELINES)}")


def identify_baselines(reports: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """{label: report} (a label per report, e.g. its file) → {baseline: report}, by each report's config, not by
    order. A baseline given twice, one missing, or three runs that are not one comparison (different codecs or
    links for the two kernel runs; the faster link not the next faster one) is a ConfigError naming it."""
    found: dict[str, tuple[str, dict[str, Any]]] = {}
    for label, report in reports.items():
        config = report.get("config")
        if not isinstance(config, dict):
            raise ConfigError(f"{label}: not a run report (no 'config' block)")
        name = baseline_of(config)
        if name in found:
            raise ConfigError(f"baselines: {found[name][0]} and {label} are both {name!r}; give one of each of: "
                              f"{', '.join(BASELINES)}")
        found[name] = (label, report)
    missing = [name for name in BASELINES if name not in found]
    if missing:
        raise ConfigError(f"baselines: no report for {', '.join(repr(m) for m in missing)} (a report is recognised "
                          "by its config: codec@transit, the same codec@gpu, codec none on the next faster link)")
    transit, gpu, faster = (found[name][1]["config"] for name in BASELINES)
    for key in ("codec", "link"):
        if transit.get(key) != gpu.get(key):
            raise ConfigError(f"baselines: the kernel runs differ in {key}: {transit.get(key)!r} in transit, "
                              f"{gpu.get(key)!r} at the GPU ({found[IN_TRANSIT][0]}, {found[AT_GPU][0]})")
    expected = next_faster_link(str(transit.get("link")))
    if faster.get("link") != expected:
        raise ConfigError(f"baselines: {found[FASTER_LINK][0]} runs on {faster.get('link')!r}, not the link next "
                          f"faster than {transit.get('link')!r} ({expected!r})")
    return {name: found[name][1] for name in BASELINES}


# --- the comparison ----------------------------------------------------------------------------------------

def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _get(report: dict[str, Any], *path: str) -> Any:
    value: Any = report
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def energy_per_request(report: dict[str, Any]) -> tuple[float | None, int]:
    """(J per request, requests counted): every joule the run spent (link + module + GPU + pool, the parts it
    measured) over the requests that finished (`requests.ok` + `requests.slo_miss`): failed and timed-out
    requests are not counted, so the energy they burned is charged to those that finished."""
    parts = [_number(v) for v in (_get(report, "energy_j") or {}).values()]
    known = [v for v in parts if v is not None]
    finished = int(sum(_number(_get(report, "requests", key)) or 0 for key in ("ok", "slo_miss")))
    if not known or finished == 0:
        return None, finished
    return math.fsum(known) / finished, finished


def baseline_row(name: str, report: dict[str, Any]) -> dict[str, Any]:
    config = report.get("config") or {}
    j_per_request, counted = energy_per_request(report)
    codec, where = config.get("codec"), config.get("compress_at")
    return {
        "baseline": name, "link": config.get("link"),
        "codec": codec if codec == "none" else f"{codec}@{where}",
        "j_per_request": j_per_request, "requests_counted": counted,
        "energy_j": dict(_get(report, "energy_j") or {}),
        "e2e_mean_s": _number(_get(report, "e2e_s", "mean")), "e2e_p99_s": _number(_get(report, "e2e_s", "p99")),
        "ttft_p99_s": _number(_get(report, "ttft_s", "p99")),
        "handoff_p99_s": _number(_get(report, "handoff_s", "p99")),
        "slo_attainment": _number(report.get("slo_attainment")),
        "faithful": report.get("faithful") is True,
        "scale": _number(config.get("effective_scale")), "dilation": _number(config.get("effective_dilation")),
    }


def _winner(rows: dict[str, dict[str, Any]], figure: str) -> str | None:
    """The baseline with the lowest `figure`; "tie: A, B" when others are within RESOLUTION of it (the emulator
    cannot tell them apart); None when any of them lacks the figure (no winner by omission)."""
    values = {name: row[figure] for name, row in rows.items()}
    if any(v is None for v in values.values()):
        return None
    best = min(values.values())
    level = [name for name in BASELINES if values[name] <= best * (1 + RESOLUTION)]
    return level[0] if len(level) == 1 else TIE + ", ".join(level)


def compare_at_equal_power(reports: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """`reports`: {baseline name (BASELINES): its run report}. Per baseline its row (baseline_row), the winner on
    energy (lowest J/request) and on latency (lowest mean E2E), and whether the kernel in transit beats both on
    both: True/False when every run was faithful and measured both figures, else None, with `unsettled` saying
    which run the comparison rests on and why."""
    missing = [name for name in BASELINES if name not in reports]
    if missing:
        raise ConfigError(f"baselines: no report for {', '.join(repr(m) for m in missing)}")
    rows = {name: baseline_row(name, reports[name]) for name in BASELINES}
    unsettled = [f"{name} was not faithful" for name, row in rows.items() if not row["faithful"]]
    unsettled += [f"{name} has no {label}" for name, row in rows.items()
                  for figure, label in (("j_per_request", "energy per request"), (LATENCY_FIGURE, "E2E"))
                  if row[figure] is None]
    energy_winner, latency_winner = _winner(rows, "j_per_request"), _winner(rows, LATENCY_FIGURE)
    beats_both: bool | None = None if unsettled else (energy_winner == IN_TRANSIT and latency_winner == IN_TRANSIT)
    return {"baselines": [rows[name] for name in BASELINES], "energy_winner": energy_winner,
            "latency_winner": latency_winner, "latency_figure": LATENCY_FIGURE,
            "kernel_beats_both": beats_both, "unsettled": unsettled, "answer": _answer(rows, energy_winner,
                                                                                      latency_winner, unsettled)}


def _answer(rows: dict[str, dict[str, Any]], energy: str | None, latency: str | None, unsettled: list[str]) -> str:
    def said(winner: str | None) -> str:
        if winner is None:
            return "-"
        names = winner.removeprefix(TIE).split(", ")
        return winner + ("" if all(rows[n]["faithful"] for n in names) else " (an unfaithful run)")

    wins = f"energy: {said(energy)}; latency (mean E2E): {said(latency)}"
    if unsettled:
        return f"not settled ({'; '.join(unsettled)}): {wins}"
    if energy == IN_TRANSIT and latency == IN_TRANSIT:
        return f"yes: the kernel in transit beats both at equal power ({wins})"
    if all(w is not None and w.startswith(TIE) and IN_TRANSIT in w for w in (energy, latency)):
        return (f"no measurable difference: all within {RESOLUTION:.0%}, the emulator's resolution ({wins})")
    return f"no: the kernel in transit does not beat both ({wins})"
