"""The TP groups' rows of the candidate table.

- tp-all-reduce: `kvtransit collective`, TP4, a switch summing the ranks' streams (the measured all-reduce share, the
  streams the switch summed), and the same sum asked of a pluggable: the middlebox at `--placement pluggable`
  started for real and refusing it (it sees one stream). Precision: BF16 partial sums of SmolLM2's MLP down
  projection through the switch's kernel against their float64 sum, no worse than NCCL's ring on the same partials
  (flows/tp/sum_accuracy.py; the realkv extra). An incumbent does the job: NVLink SHARP, so where all five pass the
  verdict is "exists". Its regime: TP size × decode batch on NVLink 4.
- moe-all-to-all: `kvtransit collective --ep 2 --dispatch fp8` (the dispatch cast at the GPUs): the measured
  collective share × the model's all-to-all part (a modelled factor, tagged); FP8's error on the real model's MLP
  inputs. Its regime: EP size × decode batch.
"""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import replace
from typing import Any

import numpy as np

from kvtransit.harness.studies.candidates.rows import (
    DeckVerdict,
    Row,
    RowContext,
    RowRun,
    budget_flag,
    faithful_runs,
    load_real_kv,
    relative_l2,
    small_report,
)
from kvtransit.harness.studies.candidates.table import (
    EXISTS,
    LINE_INPUT,
    NOT_A_CANDIDATE,
    Candidate,
    PrecisionFigure,
    RowMeasured,
)
from kvtransit.model.catalog.links import link_by_name
from kvtransit.model.judge.five_tests import BOTTLENECK_MIN_SHARE, MEASURED, Judgement, placement_test, with_basis

# The collectives as `kvtransit collective`'s own example (llama3-70b TP4 at scale 0.01, dilation 10), a decode step
# of 8 sequences, 4 steps (step 0 is a warm-up).
TP_RUN: dict[str, Any] = dict(model="llama3-70b", tp=4, tokens=8, context=2048, steps=4, scale=0.01, dilation=10.0)
# The EP group's dispatch carries the fp8 kernel's bytes, cast at the GPUs (it needs rounding: not the module's).
EP_RUN: dict[str, Any] = dict(model="mixtral-8x7b", ep=2, tokens=8, context=2048, steps=4, scale=0.01, dilation=10.0,
                              dispatch="fp8")
COMPUTE_BASIS = "modelled: the h100 roofline's decode step on the group, held on the clock"
# NVLink SHARP (NVSwitch's in-network reduction; PTX's multimem.ld_reduce, docs/reference.md §7.2) sums a TP group's
# all-reduce in the switch on NVLink 4 systems today.
SHARP = ("NVLink SHARP: NVSwitch sums the group's streams in the switch today (multimem.ld_reduce, float32 "
         "accumulation; docs/reference.md §7.2)")
# The regimes' grids: the TP sizes that split llama3-70b's heads up to this host's group limit, mixtral's EP sizes,
# and decode batches from one sequence to 128.
TP_SIZES = (2, 4, 8)
EP_SIZES = (2, 4, 8)
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128)


def _run(ctx: RowContext, base: dict[str, Any]) -> dict[str, Any]:
    """The row's run settings at the context's point (a group size, a batch)."""
    run = dict(base)
    group = "tp" if base.get("tp") else "ep"
    run[group] = int(ctx.setting(group, base[group]))
    run["tokens"] = int(ctx.setting("tokens", base["tokens"]))
    return run


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


def _real_session() -> Any:
    """SmolLM2 (the realkv extra), loaded once a process; None without the extra."""
    from kvtransit.realmodel.extra import missing_packages

    if missing_packages():
        return None
    from kvtransit.realmodel.session import Session

    return Session()


def _sum_precision(n: int) -> tuple[PrecisionFigure, dict[str, Any] | None]:
    """The switch's BF16 sum of real partial sums against their float64 sum, held to NCCL's ring on the same
    partials (flows/tp/sum_accuracy.py)."""
    session = _real_session()
    if session is None:
        return PrecisionFigure(None, None, "not measured: the realkv extra (pip install '.[realkv]') makes SmolLM2's "
                                           "partial sums", required_bits=16), None
    from kvtransit.flows.tp.sum_accuracy import BF16_UNIT_ROUNDOFF, switch_sum_errors

    errors = switch_sum_errors(session, n)
    return PrecisionFigure(errors.switch, errors.ring,
                           f"relative L2 error of the switch's BF16 sum of real TP-{n} partial sums against their "
                           f"float64 sum, vs NCCL's ring (a BF16 rounding at every hop) on the same partials "
                           f"({errors.source}; BF16's unit roundoff {BF16_UNIT_ROUNDOFF:.3g})",
                           required_bits=16), errors.as_dict()


def pluggable_refusal(n: int) -> Judgement:
    """The same sum asked of a pluggable: the middlebox started at `--placement pluggable --ranks n`, for real, and
    what it said (it sees one stream, so it refuses a sum of n)."""
    from kvtransit.harness.children import ChildFailed, reap, spawn_argv

    argv = ["-m", "kvtransit.cli", "middlebox", "--placement", "pluggable", "--ranks", str(n), "--group", "1",
            "--name", "pluggable"]

    async def ask() -> str | None:
        child = await spawn_argv("pluggable", argv)
        try:
            await child.wait_ready(one_line=True)
            return None  # it started: it accepted a sum it cannot see
        except ChildFailed as exc:
            return str(exc)
        finally:
            await reap([child])

    from kvtransit.kernels.stream_sum import declaration

    said = asyncio.run(ask())
    target = placement_test(replace(declaration(n), placement="pluggable"), 1.0,
                            measured_as="streams a pluggable sees").target
    if said is None:
        return with_basis(Judgement("placement", False, f"a pluggable accepted a sum of {n} streams", target,
                                    "the pluggable started: it should have refused the sum"), MEASURED)
    return with_basis(Judgement("placement", False, f"refused on a pluggable, {n} streams needed", target,
                                f"on a pluggable (kvtransit middlebox --placement pluggable --ranks {n}, started for "
                                f"real) it exits 2 saying: {_said(said)}",
                                {"placement": "pluggable", "streams_declared": n, "streams_seen": 1}), MEASURED)


def _said(failure: str) -> str:
    """A child's one-line error as the process printed it (ChildFailed wraps it in "(last stderr: ...)")."""
    said = failure.split("error: ", 1)[-1]
    return said[:-1] if said.endswith(")") and said.count(")") > said.count("(") else said


def row_tp_all_reduce(ctx: RowContext) -> RowRun:
    from kvtransit.kernels.stream_sum import declaration

    run = _run(ctx, TP_RUN)
    report, s = _collective(ctx, run, "switch")
    n = run["tp"]
    plan = report.plan
    share = s["measured_collective_share"] if math.isfinite(s["measured_collective_share"]) else None
    seen = float(len(report.ranks)) if report.switch and report.ok else None
    precision, sum_errors = _sum_precision(n)
    placements = (pluggable_refusal(n),) if not ctx.label else ()
    row = RowMeasured(
        ctx.name, declaration(n), share, "all-reduce share of the decode step (slowest rank's step, median share)",
        link=ctx.link, link_bytes=float(plan.modelled.allreduces * plan.modelled.allreduce_bytes),
        link_messages=plan.modelled.allreduces, line=LINE_INPUT, budget_ops_per_byte=ctx.unknowns.module_budget,
        precision=precision, streams=seen, streams_as="rank streams the switch summed per all-reduce",
        share_whole="the step", compute_basis=COMPUTE_BASIS, incumbent=SHARP, placement_runs=placements,
        notes=("required bits 16: the sum's output is a BF16 value (kernels/stream_sum.py)",
               (f"the live switch's sums checked exact by the ranks: {s['sums_checked']} (its integer payloads test "
                "the process, not the precision; the precision test reads real activations)")))
    return RowRun(row, s["scale"], s["dilation"], faithful_runs({"the collective": s}),
                  _collective_command(ctx, run, "switch"),
                  str(ctx.run_dir), measured_what="the step's all-reduce share, the streams the switch summed (n rank "
                  "processes + a switch process, real bytes), the sum on a pluggable refused by the process itself; "
                  "the sum's error on SmolLM2's real partial sums",
                  modelled_what="the GPU's compute (held on the clock, roofline); the budget from the declaration",
                  extra={**{k: s[k] for k in ("model_collective_share", "measured_collective_share", "step_error",
                                              "sums_checked", "granularity", "processes")},
                         "sum_errors": sum_errors},
                  evidence={"collective": small_report(s), "sum_errors": sum_errors})


def _dispatch_error(ctx: RowContext) -> tuple[float, float, str]:
    """FP8's error on the real model's MLP inputs (flows/tp/dispatch_accuracy.py) where the realkv extra is
    installed; else on the sample's query activations, and the figure says which. (error, FP8's bound, what.)"""
    from kvtransit.flows.tp.moe_dispatch import E4M3_HALF_ULP
    from kvtransit.kernels.ring_attention import wire_codec

    session = _real_session()
    if session is not None:
        from kvtransit.flows.tp.dispatch_accuracy import fp8_dispatch_error

        acc = fp8_dispatch_error(session)
        return acc.relative_l2, E4M3_HALF_ULP, f"relative L2 error of FP8 on the real model's MLP inputs ({acc.source})"
    sample = load_real_kv(ctx)
    x = np.ascontiguousarray(sample.q.astype(np.float32))
    what = ("relative L2 error of FP8 on the sample's query activations (the realkv extra, which measures the MLP "
            "inputs, is not installed)")
    return relative_l2(x, wire_codec("fp8")(x, 0)), E4M3_HALF_ULP, what


def row_moe_all_to_all(ctx: RowContext) -> RowRun:
    from kvtransit.model.catalog.codecs import codec_declaration

    run = _run(ctx, EP_RUN)
    report, s = _collective(ctx, run, "ring")
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
        streams_counted=False, share_whole="the step", compute_basis=COMPUTE_BASIS,
        share_factor=(f"the all-to-all's part of the collective time, {a2a_part:.0%}, is the model's "
                      "(flows/tp/model.py): the live group measures the collectives together"),
        notes=(("the live all-to-all's dispatch carries the fp8 kernel's bytes, cast at the GPUs (FP8 needs rounding, "
                "which the module does not publish; flows/tp/moe_dispatch.py)"),))
    return RowRun(row, s["scale"], s["dilation"], faithful_runs({"the collective": s}),
                  _collective_command(ctx, run, "ring"),
                  str(ctx.run_dir), measured_what="the collective share of the step (ranks exchanging real bytes, the "
                  "dispatch in FP8), FP8's error on real activations", modelled_what="the all-to-all's part of the "
                  "collective share (flows/tp/model.py); the GPU's compute and casts held on the clock",
                  extra={"measured_collective_share": measured_share, "alltoall_part": a2a_part, "fp8_error": err,
                         "step_error": s["step_error"]},
                  evidence={"collective": small_report(s)})


# --- regimes: group size × decode batch, by flows/tp/model.py -------------------------------------------------

def _group_model(run: dict[str, Any], allreduce: str, part: str) -> Any:
    def evaluate(ctx: RowContext, _own: RowRun, tokens: int, n: int) -> Any:
        from kvtransit.flows.tp.model import tp_decode_step
        from kvtransit.harness.studies.candidates.regimes import PointModel
        from kvtransit.model.catalog.devices import device_by_name
        from kvtransit.model.catalog.models import model_by_name
        from kvtransit.model.module.budget import Module

        tp, ep = (n, 0) if run.get("tp") else (1, n)
        step = tp_decode_step(model_by_name(run["model"]), device_by_name("h100"), link_by_name(ctx.link), tp=tp,
                              ep=ep, batch=tokens, context_total=tokens * run["context"], allreduce=allreduce,
                              module=Module(ops_per_byte=ctx.unknowns.module_budget))
        share = step.collective_share if part == "collective" else step.alltoall_s / step.total_s
        return PointModel(share, {"bottleneck": share >= BOTTLENECK_MIN_SHARE})
    return evaluate


def _group_regime(run: dict[str, Any], allreduce: str, part: str, sizes: tuple[int, ...], what: str) -> Any:
    from kvtransit.harness.studies.candidates.regimes import Axis, Regime

    key = "tp" if run.get("tp") else "ep"
    return Regime(Axis("tokens", "decode batch (sequences)", BATCHES, "seqs"),
                  Axis(key, f"{key.upper()} size", sizes, prefix=key.upper()),
                  _group_model(run, allreduce, part),
                  f"flows/tp/model.py: {what} of a decode step at context {run['context']:,} on the row's link",
                  home=lambda ctx: (int(ctx.setting("tokens", run["tokens"])), int(ctx.setting(key, run[key]))))


def sum_case(event: str, model_name: str, tp: int, batch: int, link_name: str) -> Any:
    """A TP group's all-reduce of a decode step's activations: summed by a switch (one hop up, the sum, one hop
    down: flows/tp/model.py), by the GPUs' ring on the same link, or by the ring on the next faster link."""
    from kvtransit.flows.tp.model import activation_bytes, ring_allreduce_s, switch_allreduce
    from kvtransit.harness.studies.candidates.spec import DEVICE, SpecCase, next_faster
    from kvtransit.model.catalog.devices import device_by_name
    from kvtransit.model.catalog.models import model_by_name
    from kvtransit.model.cost.energy import gpu_energy_j, link_energy_j
    from kvtransit.model.module.budget import Module

    model, device, link = model_by_name(model_name), device_by_name(DEVICE), link_by_name(link_name)
    s = float(activation_bytes(model, batch))
    adds = (tp - 1) * s / 2  # N − 1 adds a value, S/2 values: the GPUs' ring does them too (kernels/stream_sum.py)
    gpu_j_adds = gpu_energy_j(device, adds, 3 * (tp - 1) * s)  # each add reads two values and writes one
    faster_name = next_faster(link_name)
    faster = link_by_name(faster_name) if faster_name else None

    def transit_s(budget: float, latency_s: float) -> float:
        return switch_allreduce(s, tp, link, Module(ops_per_byte=budget, added_latency_s=latency_s)).total_s

    def transit_j(pj: float) -> float:  # every rank's S up and the sum down; the module reads every stream
        return link_energy_j(link, 2 * tp * s) + Module(pj_per_input_bit=pj).energy_j(tp * s)

    return SpecCase(event, link_name, "all-reduce-sum", float(tp), 0.5, (), transit_s, transit_j,
                    ring_allreduce_s(s, tp, link), link_energy_j(link, 2 * (tp - 1) * s) + gpu_j_adds,
                    "the GPUs' ring all-reduce on the same link (2(n−1)/n·S/B + 2(n−1)·latency)", faster_name,
                    None if faster is None else ring_allreduce_s(s, tp, faster),
                    None if faster is None else link_energy_j(faster, 2 * (tp - 1) * s) + gpu_j_adds,
                    "16 (a BF16 sum, float32 accumulation: kernels/stream_sum.py)",
                    note="the switch moves 2n·S over its ports, the ring 2(n−1)·S")


def tp_spec() -> Any:
    return sum_case(f"one all-reduce of a decode step ({TP_RUN['tokens']} sequences, TP{TP_RUN['tp']})",
                    TP_RUN["model"], TP_RUN["tp"], TP_RUN["tokens"], "nvlink4")


def moe_spec() -> Any:
    from kvtransit.flows.tp.model import alltoall_bytes
    from kvtransit.harness.studies.candidates.spec import codec_case
    from kvtransit.model.catalog.models import model_by_name

    model = model_by_name(EP_RUN["model"])
    dispatch = alltoall_bytes(model, EP_RUN["tokens"], EP_RUN["ep"]) / 2  # the dispatch's half, in BF16
    return codec_case(f"one MoE layer's dispatch ({EP_RUN['tokens']} sequences, EP{EP_RUN['ep']})", EP_RUN["model"], 1,
                      "nvlink4", codec="fp8", input_bytes=dispatch)


ROWS = (
    Row(Candidate("moe-all-to-all", "an EP group's token dispatch and combine between ranks",
                  "FP8 dispatch (fp8; model/catalog/codecs.py)",
                  "activation error no worse than an FP8 rounding's own bound (e4m3: 2^-4 relative)"),
        link="nvlink4", order=5, run=row_moe_all_to_all,
        deck=DeckVerdict(NOT_A_CANDIDATE, "7.1 % of a prefill step"),
        regime=_group_regime(EP_RUN, "ring", "alltoall", EP_SIZES, "the all-to-all's share"), spec=moe_spec),
    Row(Candidate("tp-all-reduce", "a TP group's all-reduce, summed by a switch that sees every rank's stream",
                  "stream sum (kernels/stream_sum.py: declaration(n), 0.50 op/B, placement switch)",
                  "the switch's BF16 sum of real partial sums no further from their float64 sum than NCCL's ring"),
        link="nvlink4", order=6, run=row_tp_all_reduce,
        deck=DeckVerdict(EXISTS, "yes at TP8 decode (61.5 %); a switch, not a pluggable; the place is taken "
                                 "(NVLink SHARP)"),
        regime=_group_regime(TP_RUN, "switch", "collective", TP_SIZES, "the switch all-reduce's share"),
        spec=tp_spec),
)
