"""The KV flows' live rows: a short `kvtransit up` (the Launcher, loopback), judged by its report's own verdict block;
the hand-off's row is the core's, the tier's (flows/tier/rows.py) runs the same way.

Precision: the kernel's task-level loss on the real model (docs/results/accuracy.json, `kvtransit accuracy
--end-to-end`: perplexity on the worst text, KL, top-1; the tolerance model/judge/task_accuracy.py's +1 %), at the
analogue path's bits where the file measured them; the run's K/V error against the equal-bytes baseline on the same
sampled tensors is kept beside it as context. The hand-off's regime (load × link) is mapped on the twin
(kvtransit.twin), which runs the row's very scenario at every grid point in well under a second.
"""

from __future__ import annotations

import asyncio
import functools
import json
import shlex
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from kvtransit.harness.studies.candidates.rows import DeckVerdict, Row, RowContext, RowRun, small_report
from kvtransit.harness.studies.candidates.table import PROMISING, Candidate, RowMeasured, bits_key
from kvtransit.model.judge.five_tests import BOTTLENECK_MIN_SHARE, Judgement, PrecisionMeasured
from kvtransit.paths import REPO

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
# The committed end-to-end accuracy results (kvtransit accuracy --end-to-end --needle --results ...): SmolLM2-135M,
# two texts, every codec setting and band-keep at 4..12 bits.
ACCURACY_RESULTS = REPO / "docs" / "results" / "accuracy.json"
ANALOGUE_BITS = (None, *range(4, 13))  # the bits accuracy.json measured band-keep at
# What the KV rows' non-link time is: the roofline's prefill and decode steps, held on the clock.
KV_COMPUTE_BASIS = "modelled: the h100 roofline's prefill and decode steps, held on the clock"
# The hand-off's regime: the deck's load table's rates (docs/reference.md §4.5: 8-14 req/s on 25 GbE) and below, on
# the hand-off links of the deck's link table.
HANDOFF_RATES = (2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0, 16.0)
HANDOFF_LINKS = ("eth-25g", "eth-100g", "ib-ndr", "nvlink4")


def kv_scenario(ctx: RowContext, fields_: dict[str, Any]) -> Any:
    from kvtransit.model.scenario import Scenario

    u = ctx.unknowns
    return Scenario.build(link=ctx.link, codec="freq-keep-k", compress_at="transit", module_budget=u.module_budget,
                          transform_charged=bool(u.transform_charged), precision_bits=u.precision_bits,
                          kv_sample=str(ctx.sample_path), **fields_)


def handoff_fields(ctx: RowContext) -> dict[str, Any]:
    return {**KV_RUN, "rate": float(ctx.setting("rate", KV_RUN["rate"]))}


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


def task_losses(scenario: Any, path: Path = ACCURACY_RESULTS) -> dict[str, Any] | None:
    """The scenario's codec's measured task-level loss at each analogue path's bits accuracy.json has (None: no
    file, or no row for the codec at all)."""
    from kvtransit.model.judge.task_accuracy import codec_key, task_loss_from_results

    if not path.exists():
        return None
    results = json.loads(path.read_text())
    where = str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)
    found = {}
    for bits in ANALOGUE_BITS:
        key = codec_key(scenario.codec, keep=scenario.keep, block=scenario.block, sinks=scenario.sinks,
                        variant=scenario.variant, precision_bits=bits)
        loss = task_loss_from_results(results, key, where=where)
        if loss is not None:
            found[bits_key(bits)] = loss
    return found or None


def tensor_precision(report: dict[str, Any]) -> PrecisionMeasured:
    """The run's sampled K/V errors and the equal-bytes baseline's, as its verdict block holds them."""
    values = verdict_tests(report)["precision"].values
    saved: dict[str, Any] = {f.name: values.get(f.name) for f in fields(PrecisionMeasured)}
    saved["sampled_requests"] = int(saved["sampled_requests"] or 0)
    return PrecisionMeasured(**saved)


def kv_row(ctx: RowContext, scenario: Any, report: dict[str, Any], *, share: float | None, share_of: str,
           nbytes: float, measured_what: str, modelled_what: str, notes: tuple[str, ...] = (),
           extra: dict[str, Any] | None = None) -> RowRun:
    """A KV flow's row from its run's report (its verdict block judged the five tests; precision by the codec's
    task-level loss); `extra`: the row's own figures beside the core's."""
    tests = verdict_tests(report)
    budget, placement = tests["budget"].values, tests["placement"].values
    at = report["verdict"].get("measured_at", {})
    decl = scenario.codec_declaration
    losses = task_losses(scenario)
    row = RowMeasured(
        ctx.name, decl, share, share_of, link=ctx.link, link_bytes=nbytes,
        link_busy=(report.get("link") or {}).get("busy"), budget_ops_per_byte=scenario.module_budget_ops_per_byte,
        transit_bound_frames=budget.get("transit_bound_frames"), frames=budget.get("frames"),
        precision_judgement=tests["precision"], streams=placement.get("streams_measured"),
        streams_as="middlebox KV frames in per frame out", notes=notes, compute_basis=KV_COMPUTE_BASIS,
        task_losses=losses, precision_measured=tensor_precision(report))
    return RowRun(row, at.get("scale"), at.get("dilation"), report_faithful(report), up_command(scenario, ctx),
                  str(ctx.run_dir), measured_what=measured_what, modelled_what=modelled_what,
                  extra={"kv_wait_share": report.get("kv_wait_share"), "e2e_mean_s": mean_of(report.get("e2e_s")),
                         "verdict": report["verdict"].get("verdict"), **(extra or {})},
                  evidence=small_report(report))


def row_kv_handoff(ctx: RowContext) -> RowRun:
    scenario = kv_scenario(ctx, handoff_fields(ctx))
    report = launch(ctx, scenario)
    nbytes = scenario.prompt_mean * scenario.model_spec.kv_bytes_per_token / scenario.codec_declaration.ratio
    return kv_row(ctx, scenario, report, share=report.get("kv_wait_share"),
                  share_of="exposed hand-off + decode queue wait", nbytes=nbytes,
                  measured_what=("the share, frames and placement from the run (its report's verdict block); "
                                 "precision: the codec's task-level loss on SmolLM2 (docs/results/accuracy.json), the "
                                 "run's K/V error vs the equal-bytes baseline beside it"),
                  modelled_what=("the steps' compute (held on the clock); the regime on the twin (the same scenario "
                                 "at every load and link)"))


@functools.lru_cache(maxsize=16)
def request_e2e_s(link: str, sample: str) -> float:
    """The mean E2E of the hand-off row's requests on `link`, by the twin (model seconds): what a session's requests
    take, for a flow that opens a session (a handshake) and is judged against it."""
    from kvtransit.model.scenario import Scenario
    from kvtransit.twin.serving import run_twin

    scenario = Scenario.build(link=link, codec="none", kv_sample=sample, **KV_RUN)
    times = [t for r in run_twin(scenario).records if (t := r.e2e_s) is not None]
    return sum(times) / len(times)


# --- the hand-off's regime: load × link, on the twin -----------------------------------------------------------

def handoff_model(ctx: RowContext, _own: RowRun, rate: float, link: str) -> Any:
    """The twin's run of the row's scenario at `rate` on `link`: its kv_wait_share, the figure the live row reads."""
    from kvtransit.harness.studies.candidates.regimes import PointModel
    from kvtransit.model.judge.slo import kv_wait_share
    from kvtransit.twin.serving import run_twin

    point = replace(ctx, point={"rate": rate, "link": link})
    share = kv_wait_share(run_twin(kv_scenario(point, handoff_fields(point))).records)
    return PointModel(share, {"bottleneck": None if share is None else share >= BOTTLENECK_MIN_SHARE})


def handoff_regime() -> Any:
    from kvtransit.harness.studies.candidates.regimes import Axis, Regime
    from kvtransit.model.catalog.links import LINKS

    return Regime(
        Axis("rate", "load (req/s)", HANDOFF_RATES, "req/s"),
        Axis("link", "link", HANDOFF_LINKS, choices=tuple(LINKS)),
        handoff_model, f"the twin (kvtransit.twin): the row's scenario ({KV_RUN['requests']} requests, the same seed) "
                       "at each load and link, its kv_wait_share",
        home=lambda ctx: (float(ctx.setting("rate", KV_RUN["rate"])), ctx.link))


def handoff_spec() -> Any:
    from kvtransit.harness.studies.candidates.spec import codec_case

    return codec_case("one hand-off of a 2,048-token prompt", "llama3-8b", 2048, "eth-25g", bits_from=ACCURACY_RESULTS)


ROWS = (Row(Candidate("kv-handoff", "a request's KV from prefill to decode through the middlebox",
                      "band-keep (freq-keep-k, DCT, keep 0.5; model/catalog/codecs.py)",
                      "the task-level loss on a real model within +1 % perplexity (docs/results/accuracy.json); "
                      "the K/V error against the equal-bytes baseline as context"),
            link="eth-25g", order=2, run=row_kv_handoff,
            deck=DeckVerdict(PROMISING, "only on slow links near saturation"),
            regime=handoff_regime(), spec=handoff_spec),)

