"""`kvtransit candidates`' harness: one short scenario per candidate (REFERENCE §8), each test measured from its run.

Each row function runs its flow and returns a `RowRun`: the figures (`harness/studies/candidates/table.py: RowMeasured`)
the five tests are judged from, the scale and dilation it ran at, whether it was faithful, the command that reproduces
it, its run directory, and two lines saying what was measured and what was modelled.

- kv-handoff: a short `kvtransit up` (Launcher, loopback), band-keep in transit, the real-KV sample; bottleneck =
  the report's kv_wait_share.
- kv-tier-fetch: the `tier-deck` preset's in-transit point (llama3-70b, 32k prefixes over eth-100g, the Mooncake
  trace's reuse from a warmed pool); bottleneck = fetch time / E2E.
- tp-all-reduce: `kvtransit collective`, TP4, a switch summing the ranks' streams; the measured all-reduce share.
- moe-all-to-all: `kvtransit collective --ep 2 --dispatch fp8` (ring, the dispatch cast at the GPUs); the measured
  collective share × the model's all-to-all part; FP8's error on the real model's MLP inputs (the realkv extra).
- ring-attention: `kvtransit ring`, 4 ranks passing the real-KV sample's blocks round a shaped ring, raw and with
  band-keep on every hop; the measured prompt's time beyond its held attention, the live ring's output error.
- pq-key-exchange: ML-KEM-768 handshakes over a shaped loopback link (kyber-py); link time / handshake time.
- fhe-inference: the CKKS encrypted layer over the same link (TenSEAL); (up + down) / request time.
- query-aware-selection: `kvtransit select`, a pool, the module scoring the pages' summaries in transit and decode
  over a shaped link, top-k and every token; the every-token fetch's measured share of its step, the error of what
  arrived.
- weight-streaming: `kvtransit weights`, a store and an instance: the cold start, then adapters paged in on
  demand; the adapter waits' measured share of TTFT, every byte checked against what was sent.

Each row's five tests are judged by `harness/studies/candidates/table.py`; this module only measures.
"""

from __future__ import annotations

import asyncio
import json
import math
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kvtransit.paths import REPO
from kvtransit.harness.studies.candidates.table import (
    LINE_INPUT,
    PrecisionFigure,
    RowMeasured,
    Unknowns,
)
from kvtransit.model.catalog.links import link_by_name
from kvtransit.model.judge.fidelity import model_gap
from kvtransit.model.judge.five_tests import Judgement
from kvtransit.model.module.budget import MODULE_BUDGETS

# Each row's own link when --link does not say (REFERENCE §2, §7): the KV flows, the adapters and the ciphertexts
# cross the scale-out link the testbed defaults to (Scenario.link, eth-25g), the tier the deck's eth-100g (its
# size: the tier-deck preset, issue 19 part 4); a TP or EP group's
# collectives cross the scale-up link (nvlink4, as `kvtransit collective`); ring attention's ranks are nodes
# (ib-ndr, REFERENCE §7's ring across hosts).
ROW_LINKS = {
    "kv-tier-fetch": "eth-100g", "kv-handoff": "eth-25g", "query-aware-selection": "eth-25g",
    "ring-attention": "ib-ndr", "moe-all-to-all": "nvlink4", "tp-all-reduce": "nvlink4",
    "weight-streaming": "eth-25g", "fhe-inference": "eth-25g", "pq-key-exchange": "eth-25g",
}
# Dilation 2 for the hand-off's run: at 1, table runs on this 2-core box found the prefill's or decode's step timers
# 4-60 % late (the first runs), and 6 % late on a quiet box (2026-12-02; the report's fidelity block, target 3 %).
# The tier's run holds the tier-deck preset's own dilation; the other rows hold their own clocks.
KV_DILATION = 2.0
# Short live runs (the target: the whole table well under 15 minutes on 2 cores): a light workload that
# does not queue, short outputs, the real-KV sample's channels in the KV; the scale and dilation are the Scenario's
# own choice ("auto").
KV_RUN: dict[str, Any] = dict(dilation=KV_DILATION, requests=20, rate=2.0, output_mean=64.0, output_cv=0.5,
                              prompt_mean=2048.0, prompt_cv=0.5)
KV_ACCURACY_SAMPLE = 4  # requests whose KV decode compares with the exact (the report's accuracy block)
# The tier at the deck's size (issue 19 part 4): the `tier-deck` sweep preset's in-transit point
# (harness/studies/sweep/plan.py: llama3-70b, prefixes up to 32k tokens, the Mooncake conversation trace's reuse from a
# warmed pool), on the row's link. The trace is the shared copy beside the checkout when the working directory has none.
TIER_PRESET, TIER_POINT = "tier-deck", {"compress_at": "transit"}
# The collectives as `kvtransit collective`'s own example (llama3-70b TP4 at scale 0.01, dilation 10), a decode step
# of 8 sequences, 4 steps (step 0 is a warm-up).
TP_RUN: dict[str, Any] = dict(model="llama3-70b", tp=4, tokens=8, context=2048, steps=4, scale=0.01, dilation=10.0)
# The EP group's dispatch carries the fp8 kernel's bytes, cast at the GPUs (it needs rounding: not the module's).
EP_RUN: dict[str, Any] = dict(model="mixtral-8x7b", ep=2, tokens=8, context=2048, steps=4, scale=0.01, dilation=10.0,
                              dispatch="fp8")
# Ring attention as the offline row had it (REFERENCE §7's long context): llama3-8b on h100, 4 ranks of 4,096
# tokens (a 16k prompt), raw and with band-keep on every hop; 3 prompts, the first a warm-up.
RING_RUN: dict[str, Any] = dict(model="llama3-8b", n=4, block_tokens=4096, prompts=3)
RING_BAND_KEEP: dict[str, Any] = {"keep": 0.5, "sinks": 4}
# Query-aware selection as the offline row had it: a 32k-token remote context of llama3-8b, a quarter of the pages
# (Quest's usual budget; docs/results/selection.md's 1/4 row) with the sink page kept, mean keys scored in transit,
# beside the every-token baseline; 5 decode steps, the first a warm-up.
SELECTION_RUN: dict[str, Any] = dict(model="llama3-8b", context=32768, budget=0.25, sink_pages=1, steps=5)
# Weight streaming as the offline row had it: llama3-8b's cold start, then rank-16 adapters (S-LoRA's smallest common
# rank), 100 of them by Zipf, 8 resident, for 2,048-token prompts; 12 requests at 4 req/s (a short run); at most
# 32 MB of weights on the wire (the share is a ratio of times: the scale does not move it).
WEIGHTS_RUN: dict[str, Any] = dict(model="llama3-8b", rank=16, adapters=100, capacity=8, requests=12, rate=4.0,
                                   prompt_tokens=2048)
WEIGHTS_RUN_MAX_BYTES = 32e6
PQ_SESSIONS = 5
FHE_REQUESTS = 3
SAMPLE_TEXT = "prose"


@dataclass
class RowRun:
    measured: RowMeasured
    scale: float | None
    dilation: float | None
    faithful: str  # "yes", "NO: …", or "n/a: …" (offline rows)
    command: str  # the command that reproduces the row's measurement
    run_dir: str | None
    elapsed_s: float = 0.0
    measured_what: str = ""
    modelled_what: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"scale": self.scale, "dilation": self.dilation, "faithful": self.faithful, "command": self.command,
                "run_dir": self.run_dir, "elapsed_s": self.elapsed_s, "measured": self.measured_what,
                "modelled": self.modelled_what, "figures": self.extra}


@dataclass(frozen=True)
class RowContext:
    name: str
    unknowns: Unknowns
    runs_dir: Path
    log: Callable[[str], None]
    sample_path: Path

    @property
    def link(self) -> str:
        return self.unknowns.link or ROW_LINKS[self.name]

    @property
    def run_dir(self) -> Path:
        path = self.runs_dir / self.name
        path.mkdir(parents=True, exist_ok=True)
        return path


def bits_flag(u: Unknowns) -> str:
    return "" if u.precision_bits is None else f" --precision-bits {u.precision_bits}"


def default_sample_path() -> Path:
    """tests/data/smollm2_kv_sample.npz under the working directory, else under the source checkout."""
    here = Path("tests/data/smollm2_kv_sample.npz")
    return here if here.exists() else REPO / "tests" / "data" / here.name


def load_real_kv(ctx: RowContext) -> Any:
    from kvtransit.kernels.accuracy import load_sample

    return load_sample(str(ctx.sample_path))[SAMPLE_TEXT]


# --- the live KV flows ---------------------------------------------------------------------------------------

def _kv_scenario(ctx: RowContext, fields: dict[str, Any]) -> Any:
    from kvtransit.model.scenario import Scenario

    u = ctx.unknowns
    return Scenario(link=ctx.link, codec="freq-keep-k", compress_at="transit", module_budget=u.module_budget,
                    transform_charged=bool(u.transform_charged), precision_bits=u.precision_bits,
                    kv_sample=str(ctx.sample_path), **fields)


def _launch(ctx: RowContext, scenario: Any) -> dict[str, Any]:
    from kvtransit.harness.up.launcher import Launcher

    report_path = ctx.run_dir / "report.json"
    launcher = Launcher(scenario, report_path=report_path, accuracy_sample=KV_ACCURACY_SAMPLE, drain_timeout_s=30.0,
                        log=lambda _msg: None)
    path = asyncio.run(launcher.run())
    if path is None:
        raise RuntimeError(f"{ctx.name}: the run wrote no report (see {ctx.run_dir})")
    report: dict[str, Any] = json.loads(Path(path).read_text())
    return report


def _up_command(scenario: Any, ctx: RowContext) -> str:
    argv = ["kvtransit", "up", *scenario.to_argv(), "--accuracy-sample", str(KV_ACCURACY_SAMPLE), "--links",
            "loopback", "--report", str(ctx.run_dir / "report.json")]
    return shlex.join(argv)


def _faithful(report: dict[str, Any]) -> str:
    faithful = report.get("faithful")
    if faithful is True:
        return "yes"
    reasons = [f"{k} {v.get('measured')} vs {v.get('target')}" for k, v in (report.get("fidelity") or {}).items()
               if isinstance(v, dict) and v.get("ok") is False][:2]
    return "NO" + (f" ({'; '.join(reasons)})" if reasons else "")


def _verdict_tests(report: dict[str, Any]) -> dict[str, Judgement]:
    return {t["test"]: Judgement(**t) for t in report["verdict"]["tests"]}


def _mean(block: Any) -> float | None:
    if isinstance(block, dict):
        value = block.get("mean")
        return float(value) if isinstance(value, int | float) else None
    return float(block) if isinstance(block, int | float) else None


def _kv_row(ctx: RowContext, scenario: Any, report: dict[str, Any], *, share: float | None, share_of: str,
            nbytes: float, measured_what: str, modelled_what: str, notes: tuple[str, ...] = ()) -> RowRun:
    tests = _verdict_tests(report)
    budget, placement = tests["budget"].values, tests["placement"].values
    at = report["verdict"].get("measured_at", {})
    decl = scenario.codec_declaration
    row = RowMeasured(
        ctx.name, decl, share, share_of, link=ctx.link, link_bytes=nbytes,
        link_busy=(report.get("link") or {}).get("busy"), budget_ops_per_byte=scenario.module_budget_ops_per_byte,
        transit_bound_frames=budget.get("transit_bound_frames"), frames=budget.get("frames"),
        precision_judgement=tests["precision"], streams=placement.get("streams_measured"),
        streams_as="middlebox KV frames in per frame out", notes=notes)
    return RowRun(row, at.get("scale"), at.get("dilation"), _faithful(report), _up_command(scenario, ctx),
                  str(ctx.run_dir), measured_what=measured_what, modelled_what=modelled_what,
                  extra={"kv_wait_share": report.get("kv_wait_share"), "e2e_mean_s": _mean(report.get("e2e_s")),
                         "kv_pool": report.get("kv_pool"), "verdict": report["verdict"].get("verdict")})


def row_kv_handoff(ctx: RowContext) -> RowRun:
    scenario = _kv_scenario(ctx, KV_RUN)
    report = _launch(ctx, scenario)
    nbytes = scenario.prompt_mean * scenario.model_spec.kv_bytes_per_token / scenario.codec_declaration.ratio
    return _kv_row(ctx, scenario, report, share=report.get("kv_wait_share"),
                   share_of="exposed hand-off + decode queue wait", nbytes=nbytes,
                   measured_what="all five from the run (its report's verdict block: share, frames, K/V error vs "
                                 "the equal-bytes baseline, frames in per frame out)",
                   modelled_what="nothing (the link's bytes for a --link rescale: mean prompt × KV bytes/token)")


def tier_scenario(ctx: RowContext) -> Any:
    """The tier row's scenario: the preset's in-transit point with the row's unknowns, link and KV sample."""
    from dataclasses import replace

    from kvtransit.harness.studies.sweep.plan import preset

    scenario = preset(TIER_PRESET)[0].scenario(TIER_POINT)
    u = ctx.unknowns
    return replace(scenario, link=ctx.link, module_budget=u.module_budget, transform_charged=bool(u.transform_charged),
                   precision_bits=u.precision_bits, kv_sample=str(ctx.sample_path))


def row_kv_tier_fetch(ctx: RowContext) -> RowRun:
    scenario = tier_scenario(ctx)
    report = _launch(ctx, scenario)
    pool = report.get("kv_pool") or {}
    fetch, e2e = pool.get("fetch_s_mean"), _mean(report.get("e2e_s"))
    share = fetch / e2e if isinstance(fetch, int | float) and e2e else None
    lookups = sum((pool.get("lookups") or {}).values())
    nbytes = (pool.get("fetch_wire_bytes") or 0.0) / lookups if lookups else 0.0
    warm = (pool.get("pool") or {}).get("warm") or {}
    return _kv_row(ctx, scenario, report, share=share, share_of="mean pool fetch over mean E2E", nbytes=nbytes,
                   measured_what=(f"the fetch's share of E2E (kv_pool block) at the deck's size: {scenario.model}, "
                                  f"the Mooncake trace's requests {scenario.trace_start}.. with prompts up to "
                                  f"{scenario.context_cap:,} tokens, from a pool warmed with what its first "
                                  f"{warm.get('earlier_requests', scenario.trace_start)} requests left (hit rate "
                                  f"{_percent(pool.get('hit_rate'))}); operations, budget, precision and placement "
                                  "from the same run's middlebox (the pool's fetches and write-backs run the same "
                                  "stage chain as the hand-off; decode's accuracy sample is of hand-offs)"),
                   modelled_what="nothing (the link's bytes for a --link rescale: the mean fetch's wire bytes)",
                   notes=(("precision is the hand-off's sampled K/V error in the same run: decode samples hand-offs, "
                          "not fetched blocks"),))


def _percent(value: Any) -> str:
    return f"{value:.1%}" if isinstance(value, int | float) else "not measured"


# --- the collectives ---------------------------------------------------------------------------------------

def _collective(ctx: RowContext, run: dict[str, Any], allreduce: str) -> tuple[Any, dict[str, Any]]:
    from kvtransit.flows.tp.run import plan_collective, run_collective
    from kvtransit.model.catalog.devices import device_by_name
    from kvtransit.model.catalog.models import model_by_name
    from kvtransit.model.module.budget import Module

    plan = plan_collective(model_by_name(run["model"]), device_by_name("h100"), link_by_name(ctx.link),
                           tp=run.get("tp", 0), ep=run.get("ep", 0), allreduce=allreduce, tokens=run["tokens"],
                           context=run["context"], steps=run["steps"], scale=run["scale"], dilation=run["dilation"],
                           module=Module(ops_per_byte=ctx.unknowns.module_budget),
                           dispatch=run.get("dispatch", "bf16"))
    report = asyncio.run(run_collective(plan))
    summary = report.summary()
    (ctx.run_dir / "collective.json").write_text(json.dumps(summary, indent=1, default=str))
    return report, summary


def _budget_flag(budget: float) -> str:
    """`kvtransit collective` takes a named budget only; a number has no flag there (the harness passes it)."""
    names = [name for name, value in MODULE_BUDGETS.items() if value == budget]
    return f"--module-budget {names[0]}" if names else f"(module budget {budget:g}: no collective flag)"


def _collective_command(ctx: RowContext, run: dict[str, Any], allreduce: str) -> str:
    group = f"--tp {run['tp']}" if run.get("tp") else f"--ep {run['ep']}"
    return (f"kvtransit collective --model {run['model']} {group} --allreduce {allreduce} --link {ctx.link} "
            f"--tokens {run['tokens']} --context {run['context']} --steps {run['steps']} --scale {run['scale']} "
            f"--dilation {run['dilation']:g} {_budget_flag(ctx.unknowns.module_budget)}"
            + (f" --dispatch {run['dispatch']}" if run.get("dispatch", "bf16") != "bf16" else "") + " --json")


def _faithful_runs(runs: dict[str, dict[str, Any]]) -> str:
    """`yes (...)` when every live run of a row was faithful (its summary's own verdict), else `NO (` which and
    why `)`."""
    bad = [f"{label}: {s['faithful_line']}" for label, s in runs.items() if not s.get("faithful")]
    if bad:
        return "NO (" + "; ".join(bad)[:300] + ")"
    return "yes (" + ", ".join(f"{label} within the emulator's band of the model" for label in runs) + ")"


def row_tp_all_reduce(ctx: RowContext) -> RowRun:
    from kvtransit.kernels.stream_sum import declaration

    report, s = _collective(ctx, TP_RUN, "switch")
    n = TP_RUN["tp"]
    plan = report.plan
    share = s["measured_collective_share"] if math.isfinite(s["measured_collective_share"]) else None
    exact = report.ok and s["sums_checked"] > 0
    seen = float(len(report.ranks)) if report.switch and report.ok else None
    row = RowMeasured(
        ctx.name, declaration(n), share, "all-reduce share of the decode step (slowest rank's step, median share)",
        link=ctx.link, link_bytes=float(plan.modelled.allreduces * plan.modelled.allreduce_bytes),
        link_messages=plan.modelled.allreduces, line=LINE_INPUT, budget_ops_per_byte=ctx.unknowns.module_budget,
        precision=PrecisionFigure(0.0 if exact else (None if not report.ranks else 1.0), 0.0,
                                  f"sums not equal to the reference sum ({s['sums_checked']} checked by the ranks)",
                                  required_bits=16),
        streams=seen, streams_as="rank streams the switch summed per all-reduce", share_whole="the step",
        notes=("required bits 16: the sum's output is a BF16 value (kernels/stream_sum.py)",))
    return RowRun(row, s["scale"], s["dilation"], _faithful_runs({"the collective": s}),
                  _collective_command(ctx, TP_RUN, "switch"),
                  str(ctx.run_dir), measured_what="the step's all-reduce share, every sum's exactness, the streams "
                  "the switch summed (n rank processes + a switch process, real bytes)",
                  modelled_what="the GPU's compute (held on the clock, roofline); the budget from the declaration",
                  extra={k: s[k] for k in ("model_collective_share", "measured_collective_share", "step_error",
                                           "sums_checked", "granularity", "processes")})


def relative_l2(ref: np.ndarray, got: np.ndarray) -> float:
    ref64, got64 = ref.astype(np.float64), got.astype(np.float64)
    return float(np.linalg.norm(got64 - ref64) / np.linalg.norm(ref64))


def _dispatch_error(ctx: RowContext) -> tuple[float, float, str]:
    """FP8's error on the real model's MLP inputs (flows/tp/dispatch_accuracy.py) where the realkv extra is
    installed; else on the sample's query activations, and the figure says which. (error, FP8's bound, what.)"""
    from kvtransit.flows.tp.moe_dispatch import E4M3_HALF_ULP
    from kvtransit.kernels.ring_attention import wire_codec
    from kvtransit.realmodel.extra import missing_packages

    if not missing_packages():
        from kvtransit.flows.tp.dispatch_accuracy import fp8_dispatch_error
        from kvtransit.realmodel.session import Session

        acc = fp8_dispatch_error(Session())
        return acc.relative_l2, E4M3_HALF_ULP, f"relative L2 error of FP8 on the real model's MLP inputs ({acc.source})"
    sample = load_real_kv(ctx)
    x = np.ascontiguousarray(sample.q.astype(np.float32))
    what = ("relative L2 error of FP8 on the sample's query activations (the realkv extra, which measures the MLP "
            "inputs, is not installed)")
    return relative_l2(x, wire_codec("fp8")(x, 0)), E4M3_HALF_ULP, what


def row_moe_all_to_all(ctx: RowContext) -> RowRun:
    from kvtransit.model.catalog.codecs import codec_declaration

    report, s = _collective(ctx, EP_RUN, "ring")
    m = report.plan.modelled
    a2a_part = m.alltoall_s / (m.allreduce_s + m.alltoall_s) if (m.allreduce_s + m.alltoall_s) > 0 else 0.0
    measured_share = s["measured_collective_share"]
    share = measured_share * a2a_part if math.isfinite(measured_share) else None
    err, bound, measured_as = _dispatch_error(ctx)
    row = RowMeasured(
        ctx.name, codec_declaration("fp8"), share,
        f"collective share of the step × the model's all-to-all part ({a2a_part:.0%})", link=ctx.link,
        precision=PrecisionFigure(err, bound, f"{measured_as} vs E4M3's rounding bound {bound:g}"),
        streams=1.0 if report.ok else None, streams_as="streams per hop (each rank sends to its ring neighbour)",
        share_whole="the step",
        notes=(("the live all-to-all's dispatch carries the fp8 kernel's bytes, cast at the GPUs (FP8 needs rounding, "
                "which the module does not publish; flows/tp/moe_dispatch.py)"),))
    return RowRun(row, s["scale"], s["dilation"], _faithful_runs({"the collective": s}),
                  _collective_command(ctx, EP_RUN, "ring"),
                  str(ctx.run_dir), measured_what="the collective share of the step (ranks exchanging real bytes, the "
                  "dispatch in FP8), FP8's error on real activations", modelled_what="the all-to-all's part of the "
                  "collective share (flows/tp/model.py); the GPU's compute and casts held on the clock",
                  extra={"measured_collective_share": measured_share, "alltoall_part": a2a_part, "fp8_error": err,
                         "step_error": s["step_error"]})


def _ring(ctx: RowContext, codec: str) -> tuple[Any, dict[str, Any]]:
    from kvtransit.flows.ring.run import offline_errors, plan_ring, run_ring
    from kvtransit.model.catalog.devices import device_by_name
    from kvtransit.model.catalog.models import model_by_name
    from kvtransit.model.module.budget import Module

    u = ctx.unknowns
    params = dict(RING_BAND_KEEP) if codec != "none" else {}
    if codec != "none" and u.precision_bits is not None:
        params["precision_bits"] = u.precision_bits
    plan = plan_ring(model_by_name(RING_RUN["model"]), device_by_name("h100"), link_by_name(ctx.link),
                     n=RING_RUN["n"], context=RING_RUN["n"] * RING_RUN["block_tokens"], sample=str(ctx.sample_path),
                     text=SAMPLE_TEXT, codec=codec, codec_params=params, module=Module(ops_per_byte=u.module_budget),
                     prompts=RING_RUN["prompts"], transform_charged=bool(u.transform_charged))
    report = asyncio.run(run_ring(plan))
    report.offline = offline_errors(plan)
    summary = report.summary()
    (ctx.run_dir / f"ring-{codec}.json").write_text(json.dumps(summary, indent=1, default=str))
    return report, summary


def _ring_command(ctx: RowContext, codec: str) -> str:
    u = ctx.unknowns
    argv = (f"kvtransit ring --model {RING_RUN['model']} --n {RING_RUN['n']} "
            f"--context {RING_RUN['n'] * RING_RUN['block_tokens']} --ring-link {ctx.link} --codec {codec} "
            f"--prompts {RING_RUN['prompts']}")
    if codec != "none":
        argv += "".join(f" --{k} {v}" for k, v in RING_BAND_KEEP.items())
        argv += "" if u.precision_bits is None else f" --bits {u.precision_bits}"
        argv += " --transform-charged" if u.transform_charged else ""
    return f"{argv} {_budget_flag(u.module_budget)} --json"


def row_ring_attention(ctx: RowContext) -> RowRun:
    from kvtransit.flows.ring import model as ring
    from kvtransit.kernels.ring_attention import error_after_hops, wire_codec

    raw_report, raw = _ring(ctx, "none")
    coded_report, coded = _ring(ctx, "freq-keep-k")
    plan = raw_report.plan
    n, tokens, model, device = plan.n, plan.block_tokens, plan.model, plan.device
    # Measured: the share of the raw prompt that is not the ranks' blockwise attention (held at the model's time),
    # i.e. the link time the compute did not hide.
    compute_only = model.layers * n * plan.modelled.compute_s
    share = (max(0.0, 1 - compute_only / raw["measured_prompt_s"])
             if raw_report.ok and math.isfinite(raw["measured_prompt_s"]) else None)

    def share_on(link: Any) -> float:
        h = ring.hop(model, device, link, tokens)
        return max(0.0, h.link_s - h.compute_s) / h.total_s  # the part of a hop the compute does not hide

    sample = load_real_kv(ctx)
    fp8 = error_after_hops(sample.q, sample.q_positions, sample.k, sample.v, n, wire_codec("fp8")).ring
    acc = coded.get("accuracy") or {}
    err = acc.get("out_err_ring") if coded_report.ok else None
    saving = (1 - coded["measured_prompt_s"] / raw["measured_prompt_s"]
              if raw_report.ok and coded_report.ok else math.nan)
    row = RowMeasured(
        ctx.name, coded_report.plan.declaration, share,
        f"the raw prompt's time beyond its blockwise attention (link time not hidden), ring of {n}, {tokens:,}-token "
        f"blocks of {model.name}", share_by_link={name: share_on(link) for name, link in _links().items()},
        link=ctx.link, link_bytes=float(ring.block_bytes(model, tokens)), share_whole="a prompt",
        budget_ops_per_byte=ctx.unknowns.module_budget,
        precision=PrecisionFigure(err, fp8, f"attention-output error of the live ring of {n} (band-keep on every hop, "
                                  "each block as far as it travelled) vs fp8's at equal bytes",
                                  at_bits=ctx.unknowns.precision_bits),
        streams=1.0 if coded_report.ok else None, streams_as="streams per hop (a rank sends to its neighbour)")
    return RowRun(row, raw["scale"], max(raw["dilation"], coded["dilation"]),
                  _faithful_runs({"raw ring": raw, "band-keep ring": coded}), _ring_command(ctx, "freq-keep-k"),
                  str(ctx.run_dir),
                  measured_what="the raw and band-keep prompts (ranks passing the real-KV sample's blocks round a "
                                "shaped ring), the live ring's output error",
                  modelled_what="the blockwise attention held on the clock (flows/ring/model.py) and the share on "
                                "other links (flips); fp8's error (its baseline) offline on the same blocks",
                  extra={"raw_prompt_s": raw["measured_prompt_s"], "band_keep_prompt_s": coded["measured_prompt_s"],
                         "saving": saving, "ring_error": err, "fp8_ring_error": fp8,
                         "offline_ring_error": (coded.get("offline") or {}).get("ring"),
                         "commands": [_ring_command(ctx, "none"), _ring_command(ctx, "freq-keep-k")]})


def _selection(ctx: RowContext, budget: float | None) -> tuple[Any, dict[str, Any]]:
    from kvtransit.flows.selection.run import offline_selection, plan_selection, run_selection
    from kvtransit.model.catalog.devices import device_by_name
    from kvtransit.model.catalog.models import model_by_name
    from kvtransit.model.module.budget import Module

    u = ctx.unknowns
    plan = plan_selection(model_by_name(SELECTION_RUN["model"]), device_by_name("h100"), link_by_name(ctx.link),
                          context=SELECTION_RUN["context"], sample=str(ctx.sample_path), text=SAMPLE_TEXT,
                          budget=budget, sink_pages=SELECTION_RUN["sink_pages"], precision_bits=u.precision_bits,
                          module=Module(ops_per_byte=u.module_budget), steps=SELECTION_RUN["steps"])
    report = asyncio.run(run_selection(plan))
    report.offline = offline_selection(plan)
    summary = report.summary()
    name = "all" if budget is None else "top-k"
    (ctx.run_dir / f"select-{name}.json").write_text(json.dumps(summary, indent=1, default=str))
    return report, summary


def _selection_command(ctx: RowContext) -> str:
    u = ctx.unknowns
    bits = "" if u.precision_bits is None else f" --score-bits {u.precision_bits}"
    return (f"kvtransit select --model {SELECTION_RUN['model']} --context {SELECTION_RUN['context']} --link "
            f"{ctx.link} --budget {SELECTION_RUN['budget']:g} --sink-pages {SELECTION_RUN['sink_pages']} --steps "
            f"{SELECTION_RUN['steps']}{bits} {_budget_flag(u.module_budget)} --json")


def row_query_aware_selection(ctx: RowContext) -> RowRun:
    from kvtransit.flows.selection.model import SelectionStep, scoring_declaration
    from kvtransit.kernels.ring_attention import full_attention, wire_codec
    from kvtransit.model.judge.five_tests import equal_bytes_baseline

    top_report, top = _selection(ctx, SELECTION_RUN["budget"])
    all_report, everything = _selection(ctx, None)
    plan = all_report.plan
    model, context = plan.model, plan.context
    # Measured: the every-token fetch's share of its decode step (the step's compute held at the model's time).
    share = (everything["measured_fetch_s"] / everything["measured_step_s"]
             if all_report.ok and math.isfinite(everything["measured_step_s"]) else None)
    step_s = plan.model_compute_s

    def share_on(link: Any) -> float:
        fetch = SelectionStep(model, context).fetch_time_s(link)
        return fetch / (fetch + step_s)

    ratio = SelectionStep(model, context, SELECTION_RUN["budget"]).reduction
    baseline = equal_bytes_baseline(ratio)
    sample = load_real_kv(ctx)
    q, k, v, pos = sample.q, sample.k, sample.v, sample.q_positions
    codec = wire_codec(baseline)
    base_err = relative_l2(full_attention(q, pos, k, v), full_attention(q, pos, codec(k, 0), codec(v, 0)))
    acc = top.get("accuracy") or {}
    row = RowMeasured(
        ctx.name, scoring_declaration(model, "mean"), share,
        f"the every-token fetch's share of its decode step (fetch / step), {model.name} at {context:,} tokens",
        share_by_link={name: share_on(link) for name, link in _links().items()}, link=ctx.link,
        link_bytes=float(SelectionStep(model, context).all_kv_bytes), share_whole="a decode step", line=LINE_INPUT,
        budget_ops_per_byte=ctx.unknowns.module_budget,
        precision=PrecisionFigure(acc.get("output_error") if top_report.ok else None, base_err,
                                  f"attention-output error of what arrived, budget {SELECTION_RUN['budget']:g} of the "
                                  f"pages (sink page kept) vs {baseline} at equal bytes (ratio {ratio:.2f})",
                                  at_bits=ctx.unknowns.precision_bits),
        streams=1.0 if top_report.ok else None, streams_as="streams scored (one context's summaries)")
    effect = (everything["measured_step_s"] / top["measured_step_s"]
              if top_report.ok and all_report.ok else math.nan)
    return RowRun(row, top["scale"], max(top["dilation"], everything["dilation"]),
                  _faithful_runs({"top-k": top, "every token": everything}), _selection_command(ctx), str(ctx.run_dir),
                  measured_what="the every-token and the top-k decode steps (a pool, the module scoring the "
                                "summaries in transit, decode ranking and fetching, over a shaped link), the recall "
                                "and output error of what arrived",
                  modelled_what="the decode step's compute held on the clock (model/cost/roofline.py) and the share on "
                                "other links (flips); the equal-bytes baseline's error offline on the same sample",
                  extra={"recall": acc.get("recall"), "output_error": acc.get("output_error"), "baseline": baseline,
                         "baseline_error": base_err, "reduction": ratio, "step_ratio": effect,
                         "all_step_s": everything["measured_step_s"], "top_k_step_s": top["measured_step_s"]})


def row_weight_streaming(ctx: RowContext) -> RowRun:
    from dataclasses import replace

    from kvtransit.flows.weights.model import AdapterShape, pull_s, serve_adapter_requests
    from kvtransit.flows.weights.run import LOSSLESS_KERNELS, plan_weights, run_weights
    from kvtransit.model.catalog.devices import device_by_name
    from kvtransit.model.catalog.models import model_by_name
    from kvtransit.model.errors import ConfigError
    from kvtransit.model.kv_scale import HOST_BUDGET_BPS
    from kvtransit.model.module.budget import flow_check

    u = ctx.unknowns
    model, device, link = model_by_name(WEIGHTS_RUN["model"]), device_by_name("h100"), link_by_name(ctx.link)
    decl = replace(LOSSLESS_KERNELS["none"], name="none (lossless)", precision_bits=u.precision_bits)
    try:
        flow_check(decl, "weights")
        refused = None
    except ConfigError as exc:  # the run still measures the flow (kernel none), the precision test reads this
        refused = str(exc)
    scale = min(1.0, HOST_BUDGET_BPS / link.bandwidth_Bps, WEIGHTS_RUN_MAX_BYTES / model.resident_weight_bytes)
    run = {k: v for k, v in WEIGHTS_RUN.items() if k != "model"}
    plan = plan_weights(model, device, link, scale=scale, **run)
    report = asyncio.run(run_weights(plan))
    s = report.summary()
    (ctx.run_dir / "weights.json").write_text(json.dumps(s, indent=1, default=str))
    records = report.results.get("instance", {}).get("requests", []) if report.ok else []
    waits = sum(r["wait_s"] for r in records) / plan.dilation
    ttfts = sum(r["ttft_s"] for r in records) / plan.dilation
    share = waits / ttfts if records and ttfts > 0 else None
    shape = AdapterShape(model, WEIGHTS_RUN["rank"])

    def share_on(other: Any) -> float:  # the same requests served by the model on another link (flips)
        served = serve_adapter_requests(plan.arrivals_s, plan.adapters, plan.capacity,
                                        [pull_s(shape.nbytes, other)] * plan.requests, plan.prefill_s)
        return sum(m.wait_s for m in served) / sum(m.ttft_s for m in served)

    error: float | None
    if refused is not None:
        error, measured_as = 1.0, f"refused: {refused}"
    else:  # every blob was checked byte for byte at the instance: a changed byte fails the run
        error, measured_as = (0.0 if report.ok else None), "BF16 weight bytes not returned bit for bit (every load)"
    faithful = _faithful_runs({"the weight flow": s})
    row = RowMeasured(
        ctx.name, replace(decl, precision_bits=None), share,
        f"adapter paging: load waits / TTFT, {WEIGHTS_RUN['adapters']} rank-{WEIGHTS_RUN['rank']} adapters, Zipf, "
        f"{WEIGHTS_RUN['capacity']} resident", share_by_link={n: share_on(k) for n, k in _links().items()},
        link=ctx.link, share_whole="TTFT", link_bytes=float(shape.nbytes), line=LINE_INPUT,
        precision=PrecisionFigure(error, 0.0, measured_as, required_bits=16),
        streams=1.0 if report.ok else None, streams_as="streams (one adapter to one instance)",
        notes=(("kernel none moves no byte off the link (ratio 1): the lossless compressor a user would try (zstd, "
                "1.28 on BF16 weights, `kvtransit weights --kernel zstd --policy host`) branches on the data "
                "(comparison), which the module does not publish"),
               "required bits 16: a BF16 weight (model/module/budget.py: flow_check)"))
    command = (f"kvtransit weights --model {WEIGHTS_RUN['model']} --link {ctx.link} --rank {WEIGHTS_RUN['rank']} "
               f"--adapters {WEIGHTS_RUN['adapters']} --capacity {WEIGHTS_RUN['capacity']} --requests "
               f"{WEIGHTS_RUN['requests']} --rate {WEIGHTS_RUN['rate']:g} --prompt {WEIGHTS_RUN['prompt_tokens']} "
               f"--scale {scale:.4g} --json")
    return RowRun(row, scale, plan.dilation, faithful, command, str(ctx.run_dir),
                  measured_what="the cold start and every request's adapter wait and TTFT (a store and an instance "
                                "over a shaped link), every byte checked against what was sent",
                  modelled_what=("the prefill held on the clock (model/cost/roofline.py) and the share on other links "
                                 "(flips)"),
                  extra={"adapter_bytes": shape.nbytes, "misses": s.get("misses"), "hits": s.get("hits"),
                         "miss_ttft_error_median": s.get("miss_ttft_error_median"),
                         "cold_start_s": s.get("cold_start_s"), "cold_start_error": s.get("cold_start_error")})


def _links() -> dict[str, Any]:
    from kvtransit.model.catalog.links import LINKS

    return dict(LINKS)


# --- the ciphertexts ---------------------------------------------------------------------------------------

def _not_run(ctx: RowContext, decl: Any, why: str, command: str) -> RowRun:
    row = RowMeasured(ctx.name, decl, None, "-", not_run=f"not run: {why.removeprefix('not installed: ')}"
                      if why.startswith("not installed") else why)
    return RowRun(row, None, None, "n/a: not run", command, None, measured_what="nothing", modelled_what="nothing")


def _serial_faithful(measured_s: float, modelled_s: float, dilation: Any, what: str) -> str:
    """A ciphertext row's fidelity: its median link time against the link model, in the live groups' band."""
    gap = model_gap(measured_s, modelled_s, dilation.dilation, what)
    return (f"{'yes' if gap.ok else 'NO'} ({what} {gap.measured:+.1%} off the link model at dilation "
            f"{dilation.dilation:g}, {dilation.why}{'' if gap.ok else '; ' + gap.hint})")


def row_pq_key_exchange(ctx: RowContext) -> RowRun:
    from kvtransit.flows.ciphertext.handshake import NotInstalled, dilated_handshakes
    from kvtransit.kernels import ntt

    link = link_by_name(ctx.link)
    command = f"python -m kvtransit.flows.ciphertext --sessions {PQ_SESSIONS} --link {ctx.link} --dilation auto"
    try:
        rep = asyncio.run(dilated_handshakes(PQ_SESSIONS, rate_Bps=link.bandwidth_Bps, latency_s=link.latency_s))
    except NotInstalled as exc:
        return _not_run(ctx, ntt.declaration(), str(exc), command)
    (ctx.run_dir / "pqkex.json").write_text(json.dumps(rep.as_dict(), indent=1, default=str))
    link_s = sum(rep.link_s_per_session)
    share = link_s / (link_s + rep.compute_s) if link_s + rep.compute_s > 0 else None
    wrong = rep.sessions - rep.secrets_equal + (0 if rep.ntt_check is None or rep.ntt_check.ok else 1)
    median_link = rep.link_s_median
    faithful = _serial_faithful(median_link, rep.modelled_link_s, rep.dilation, "a handshake's link time")
    row = RowMeasured(
        ctx.name, ntt.declaration(True), share, "link time of a handshake / its whole time (KEM compute on this CPU)",
        decl_other_transform=ntt.declaration(False), link=ctx.link,
        link_bytes=float(rep.bytes_client_to_server + rep.bytes_server_to_client) / rep.sessions, link_messages=2,
        line=LINE_INPUT, precision=PrecisionFigure(
            float(wrong), 0.0, "sessions whose secrets differ + an NTT check that failed (kyber-py's arithmetic)",
            required_bits=((ntt.Q - 1) ** 2).bit_length()),
        streams=1.0, streams_as="connections a handshake uses (one client to one server)", share_whole="a handshake",
        notes=((f"required bits {((ntt.Q - 1) ** 2).bit_length()}: a product of two coefficients mod q = {ntt.Q} "
               "before its reduction"),))
    return RowRun(row, 1.0, rep.dilation.dilation, faithful, command, str(ctx.run_dir),
                  measured_what=f"{rep.sessions} handshakes: link and compute time, shared secrets, the NTT against "
                                "the library", modelled_what="nothing",
                  extra={"session_rate": rep.session_rate, "link_s_median": median_link,
                         "modelled_link_s": rep.modelled_link_s, "compute_s": rep.compute_s})


def row_fhe_inference(ctx: RowContext) -> RowRun:
    from kvtransit.flows.ciphertext.encrypted_layer import (
        COEFF_MOD_BIT_SIZES,
        ERROR_TOLERANCE,
        NotInstalled,
        dilated_layer,
    )
    from kvtransit.kernels import ntt

    link = link_by_name(ctx.link)
    command = f"python -m kvtransit.flows.ciphertext.fhe --requests {FHE_REQUESTS} --link {ctx.link} --dilation auto"
    try:
        rep = asyncio.run(dilated_layer(FHE_REQUESTS, rate_Bps=link.bandwidth_Bps, latency_s=link.latency_s))
    except NotInstalled as exc:
        return _not_run(ctx, ntt.declaration(), str(exc), command)
    (ctx.run_dir / "fhe.json").write_text(json.dumps(rep.as_dict(), indent=1, default=str))
    row = RowMeasured(
        ctx.name, ntt.declaration(True), rep.transfer_share, "ciphertexts' transfer (up + down) / request time",
        decl_other_transform=ntt.declaration(False), link=ctx.link,
        link_bytes=float(rep.input_ciphertext_bytes + rep.output_ciphertext_bytes), link_messages=2, line=LINE_INPUT,
        precision=PrecisionFigure(rep.max_abs_error, ERROR_TOLERANCE, "largest |decrypted − float64| of the layer",
                                  required_bits=max(COEFF_MOD_BIT_SIZES)),
        streams=1.0, streams_as="connections a request uses (one client to one server)", share_whole="a request",
        notes=(("the kernel is the NTT declaration of kernels/ntt.py (ML-KEM's), a proxy for CKKS's NTTs over "
               f"{max(COEFF_MOD_BIT_SIZES)}-bit primes: the same butterflies, wider moduli"),
               f"required bits {max(COEFF_MOD_BIT_SIZES)}: CKKS's largest coefficient modulus"))
    return RowRun(row, 1.0, rep.dilation.dilation,
                  _serial_faithful(rep.transfer_s_median, rep.modelled_transfer_s, rep.dilation,
                                   "the ciphertexts' transfer"), command, str(ctx.run_dir),
                  measured_what=f"{rep.requests} encrypted requests: encrypt, up, compute, down, decrypt; the error",
                  modelled_what="nothing",
                  extra={"transfer_share": rep.transfer_share, "max_abs_error": rep.max_abs_error,
                         "ciphertext_bytes": [rep.input_ciphertext_bytes, rep.output_ciphertext_bytes]})


LIVE_ROWS: dict[str, Callable[[RowContext], RowRun]] = {
    "kv-tier-fetch": row_kv_tier_fetch, "kv-handoff": row_kv_handoff, "moe-all-to-all": row_moe_all_to_all,
    "ring-attention": row_ring_attention, "query-aware-selection": row_query_aware_selection,
    "weight-streaming": row_weight_streaming,
    "tp-all-reduce": row_tp_all_reduce, "fhe-inference": row_fhe_inference, "pq-key-exchange": row_pq_key_exchange,
}


def rows() -> dict[str, Callable[[RowContext], RowRun]]:
    """Every row's function: every flow runs live."""
    return dict(LIVE_ROWS)


def run_rows(names: tuple[str, ...], unknowns: Unknowns, runs_dir: Path, *, sample_path: Path | None = None,
             log: Callable[[str], None] = print) -> list[RowRun]:
    """Run each named row in table order; a row that fails is a row saying so, not a crash of the table."""
    sample = sample_path or default_sample_path()
    by_name = rows()
    runs = []
    for name in names:
        ctx = RowContext(name, unknowns, runs_dir, log, sample)
        log(f"candidates: {name} ...")
        began = time.monotonic()
        try:
            run = by_name[name](ctx)
        except Exception as exc:
            from kvtransit.model.catalog.codecs import codec_declaration

            run = _not_run(ctx, codec_declaration("none"), f"not run: the run failed: {type(exc).__name__}: {exc}",
                           f"kvtransit candidates --only {name}")
        run.elapsed_s = time.monotonic() - began
        log(f"candidates: {name} done in {run.elapsed_s:.1f} s")
        runs.append(run)
    return runs
