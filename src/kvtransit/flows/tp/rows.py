"""The TP groups' rows of the candidate table: tp-all-reduce (`kvtransit collective`, TP4, a switch summing the ranks'
streams; the measured all-reduce share) and moe-all-to-all (`kvtransit collective --ep 2 --dispatch fp8`, the
dispatch cast at the GPUs; the measured collective share × the model's all-to-all part; FP8's error on the real
model's MLP inputs where the realkv extra is installed)."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import numpy as np

from kvtransit.harness.studies.candidates.rows import (
    Row,
    RowContext,
    RowRun,
    budget_flag,
    faithful_runs,
    load_real_kv,
    relative_l2,
)
from kvtransit.harness.studies.candidates.table import LINE_INPUT, Candidate, PrecisionFigure, RowMeasured
from kvtransit.model.catalog.links import link_by_name

# The collectives as `kvtransit collective`'s own example (llama3-70b TP4 at scale 0.01, dilation 10), a decode step
# of 8 sequences, 4 steps (step 0 is a warm-up).
TP_RUN: dict[str, Any] = dict(model="llama3-70b", tp=4, tokens=8, context=2048, steps=4, scale=0.01, dilation=10.0)
# The EP group's dispatch carries the fp8 kernel's bytes, cast at the GPUs (it needs rounding: not the module's).
EP_RUN: dict[str, Any] = dict(model="mixtral-8x7b", ep=2, tokens=8, context=2048, steps=4, scale=0.01, dilation=10.0,
                              dispatch="fp8")


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


def _collective_command(ctx: RowContext, run: dict[str, Any], allreduce: str) -> str:
    group = f"--tp {run['tp']}" if run.get("tp") else f"--ep {run['ep']}"
    return (f"kvtransit collective --model {run['model']} {group} --allreduce {allreduce} --scaleup-link {ctx.link} "
            f"--tokens {run['tokens']} --context {run['context']} --steps {run['steps']} --scale {run['scale']} "
            f"--dilation {run['dilation']:g} {budget_flag(ctx.unknowns.module_budget)}"
            + (f" --dispatch {run['dispatch']}" if run.get("dispatch", "bf16") != "bf16" else "") + " --json")


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
    return RowRun(row, s["scale"], s["dilation"], faithful_runs({"the collective": s}),
                  _collective_command(ctx, TP_RUN, "switch"),
                  str(ctx.run_dir), measured_what="the step's all-reduce share, every sum's exactness, the streams "
                  "the switch summed (n rank processes + a switch process, real bytes)",
                  modelled_what="the GPU's compute (held on the clock, roofline); the budget from the declaration",
                  extra={k: s[k] for k in ("model_collective_share", "measured_collective_share", "step_error",
                                           "sums_checked", "granularity", "processes")})


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
        streams_counted=False,
        share_whole="the step",
        notes=(("the live all-to-all's dispatch carries the fp8 kernel's bytes, cast at the GPUs (FP8 needs rounding, "
                "which the module does not publish; flows/tp/moe_dispatch.py)"),))
    return RowRun(row, s["scale"], s["dilation"], faithful_runs({"the collective": s}),
                  _collective_command(ctx, EP_RUN, "ring"),
                  str(ctx.run_dir), measured_what="the collective share of the step (ranks exchanging real bytes, the "
                  "dispatch in FP8), FP8's error on real activations", modelled_what="the all-to-all's part of the "
                  "collective share (flows/tp/model.py); the GPU's compute and casts held on the clock",
                  extra={"measured_collective_share": measured_share, "alltoall_part": a2a_part, "fp8_error": err,
                         "step_error": s["step_error"]})


ROWS = (
    Row(Candidate("moe-all-to-all", "an EP group's token dispatch and combine between ranks",
              "FP8 dispatch (fp8; model/catalog/codecs.py)",
              "activation error no worse than an FP8 rounding's own bound (e4m3: 2^-4 relative)"),
        link="nvlink4", order=5, run=row_moe_all_to_all),
    Row(Candidate("tp-all-reduce", "a TP group's all-reduce, summed by a switch that sees every rank's stream",
              "stream sum (kernels/stream_sum.py: declaration(n), 0.50 op/B, placement switch)",
              "every sum exact against the reference sum (BF16 out, float32 accumulation)"),
        link="nvlink4", order=6, run=row_tp_all_reduce),
)
