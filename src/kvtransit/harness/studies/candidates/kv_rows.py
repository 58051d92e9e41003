"""The KV flows' live rows: a short `kvtransit up` (the Launcher, loopback), judged by its report's own verdict block;
the hand-off's row is the core's, the tier's (flows/tier/rows.py) runs the same way."""

from __future__ import annotations

import asyncio
import json
import shlex
from pathlib import Path
from typing import Any

from kvtransit.harness.studies.candidates.rows import Row, RowContext, RowRun
from kvtransit.harness.studies.candidates.table import Candidate, RowMeasured
from kvtransit.model.judge.five_tests import Judgement

# Dilation 2 for the hand-off's run: at 1, table runs on this 2-core box found the prefill's or decode's step timers
# 4-60 % late (the first runs), and 6 % late on a quiet box (2026-12-02; the report's fidelity block, target 3 %).
# The tier's run holds the tier-deck preset's own dilation; the other rows hold their own clocks.
KV_DILATION = 2.0
# Short live runs (kvtransit's target: the whole table well under 15 minutes on 2 cores): a light workload that
# does not queue, short outputs, the real-KV sample's channels in the KV; the scale and dilation are the Scenario's
# own choice ("auto").
KV_RUN: dict[str, Any] = dict(dilation=KV_DILATION, requests=20, rate=2.0, output_mean=64.0, output_cv=0.5,
                              prompt_mean=2048.0, prompt_cv=0.5)
KV_ACCURACY_SAMPLE = 4  # requests whose KV decode compares with the exact (the report's accuracy block)


def kv_scenario(ctx: RowContext, fields: dict[str, Any]) -> Any:
    from kvtransit.model.scenario import Scenario

    u = ctx.unknowns
    return Scenario.build(link=ctx.link, codec="freq-keep-k", compress_at="transit", module_budget=u.module_budget,
                    transform_charged=bool(u.transform_charged), precision_bits=u.precision_bits,
                    kv_sample=str(ctx.sample_path), **fields)


def launch(ctx: RowContext, scenario: Any) -> dict[str, Any]:
    from kvtransit.harness.up.launcher import Launcher

    report_path = ctx.run_dir / "report.json"
    launcher = Launcher(scenario, report_path=report_path, accuracy_sample=KV_ACCURACY_SAMPLE, drain_timeout_s=30.0,
                        log=lambda _msg: None)
    path = asyncio.run(launcher.run())
    if path is None:
        raise RuntimeError(f"{ctx.name}: the run wrote no report (see {ctx.run_dir})")
    report: dict[str, Any] = json.loads(Path(path).read_text())
    return report


def up_command(scenario: Any, ctx: RowContext) -> str:
    argv = ["kvtransit", "up", *scenario.to_argv(), "--accuracy-sample", str(KV_ACCURACY_SAMPLE), "--links",
            "loopback", "--report", str(ctx.run_dir / "report.json")]
    return shlex.join(argv)


def report_faithful(report: dict[str, Any]) -> str:
    faithful = report.get("faithful")
    if faithful is True:
        return "yes"
    reasons = [f"{k} {v.get('measured')} vs {v.get('target')}" for k, v in (report.get("fidelity") or {}).items()
               if isinstance(v, dict) and v.get("ok") is False][:2]
    return "NO" + (f" ({'; '.join(reasons)})" if reasons else "")


def verdict_tests(report: dict[str, Any]) -> dict[str, Judgement]:
    return {t["test"]: Judgement(**t) for t in report["verdict"]["tests"]}


def mean_of(block: Any) -> float | None:
    if isinstance(block, dict):
        value = block.get("mean")
        return float(value) if isinstance(value, int | float) else None
    return float(block) if isinstance(block, int | float) else None


def kv_row(ctx: RowContext, scenario: Any, report: dict[str, Any], *, share: float | None, share_of: str,
            nbytes: float, measured_what: str, modelled_what: str, notes: tuple[str, ...] = (),
            extra: dict[str, Any] | None = None) -> RowRun:
    """A KV flow's row from its run's report (its verdict block judged the five tests); `extra`: the row's own
    figures beside the core's."""
    tests = verdict_tests(report)
    budget, placement = tests["budget"].values, tests["placement"].values
    at = report["verdict"].get("measured_at", {})
    decl = scenario.codec_declaration
    row = RowMeasured(
        ctx.name, decl, share, share_of, link=ctx.link, link_bytes=nbytes,
        link_busy=(report.get("link") or {}).get("busy"), budget_ops_per_byte=scenario.module_budget_ops_per_byte,
        transit_bound_frames=budget.get("transit_bound_frames"), frames=budget.get("frames"),
        precision_judgement=tests["precision"], streams=placement.get("streams_measured"),
        streams_as="middlebox KV frames in per frame out", notes=notes)
    return RowRun(row, at.get("scale"), at.get("dilation"), report_faithful(report), up_command(scenario, ctx),
                  str(ctx.run_dir), measured_what=measured_what, modelled_what=modelled_what,
                  extra={"kv_wait_share": report.get("kv_wait_share"), "e2e_mean_s": mean_of(report.get("e2e_s")),
                         "verdict": report["verdict"].get("verdict"), **(extra or {})})


def row_kv_handoff(ctx: RowContext) -> RowRun:
    scenario = kv_scenario(ctx, KV_RUN)
    report = launch(ctx, scenario)
    nbytes = scenario.prompt_mean * scenario.model_spec.kv_bytes_per_token / scenario.codec_declaration.ratio
    return kv_row(ctx, scenario, report, share=report.get("kv_wait_share"),
                   share_of="exposed hand-off + decode queue wait", nbytes=nbytes,
                   measured_what="all five from the run (its report's verdict block: share, frames, K/V error vs "
                                 "the equal-bytes baseline, frames in per frame out)",
                   modelled_what="nothing (the link's bytes for a --link rescale: mean prompt × KV bytes/token)")




ROWS = (Row(Candidate("kv-handoff", "a request's KV from prefill to decode through the middlebox",
              "band-keep (freq-keep-k, DCT, keep 0.5; model/catalog/codecs.py)",
              "K and V error no worse than the equal-bytes baseline's on the same sampled tensors (five_tests)"),
            link="eth-25g", order=2, run=row_kv_handoff),)
