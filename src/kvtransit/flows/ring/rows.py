"""Ring attention's row of the candidate table: `kvtransit ring`, 4 ranks passing the real-KV sample's blocks round a
shaped ring, raw and with band-keep on every hop; the measured prompt's time beyond its held attention, the live
ring's output error."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

from kvtransit.harness.studies.candidates.rows import (
    SAMPLE_TEXT,
    Row,
    RowContext,
    RowRun,
    budget_flag,
    faithful_runs,
    links,
    load_real_kv,
)
from kvtransit.harness.studies.candidates.table import Candidate, PrecisionFigure, RowMeasured
from kvtransit.model.catalog.links import link_by_name

# Ring attention as the offline row had it (docs/reference.md §7's long context): llama3-8b on h100, 4 ranks of 4,096
# tokens (a 16k prompt), raw and with band-keep on every hop; 3 prompts, the first a warm-up.
RING_RUN: dict[str, Any] = dict(model="llama3-8b", n=4, block_tokens=4096, prompts=3)
RING_BAND_KEEP: dict[str, Any] = {"keep": 0.5, "sinks": 4}


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
    argv = (f"kvtransit ring --model {RING_RUN['model']} --ring-ranks {RING_RUN['n']} "
            f"--ring-prompt {RING_RUN['n'] * RING_RUN['block_tokens']} --ring-link {ctx.link} --codec {codec} "
            f"--prompts {RING_RUN['prompts']}")
    if codec != "none":
        argv += "".join(f" --{k} {v}" for k, v in RING_BAND_KEEP.items())
        argv += "" if u.precision_bits is None else f" --precision-bits {u.precision_bits}"
        argv += " --transform-charged" if u.transform_charged else ""
    return f"{argv} {budget_flag(u.module_budget)} --json"


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
        f"blocks of {model.name}", share_by_link={name: share_on(link) for name, link in links().items()},
        link=ctx.link, link_bytes=float(ring.block_bytes(model, tokens)), share_whole="a prompt",
        budget_ops_per_byte=ctx.unknowns.module_budget,
        precision=PrecisionFigure(err, fp8, f"attention-output error of the live ring of {n} (band-keep on every hop, "
                                  "each block as far as it travelled) vs fp8's at equal bytes",
                                  at_bits=ctx.unknowns.precision_bits),
        streams=1.0 if coded_report.ok else None, streams_as="streams per hop (a rank sends to its neighbour)",
        streams_counted=False)
    return RowRun(row, raw["scale"], max(raw["dilation"], coded["dilation"]),
                  faithful_runs({"raw ring": raw, "band-keep ring": coded}), _ring_command(ctx, "freq-keep-k"),
                  str(ctx.run_dir),
                  measured_what="the raw and band-keep prompts (ranks passing the real-KV sample's blocks round a "
                                "shaped ring), the live ring's output error",
                  modelled_what="the blockwise attention held on the clock (flows/ring/model.py) and the share on "
                                "other links (flips); fp8's error (its baseline) offline on the same blocks",
                  extra={"raw_prompt_s": raw["measured_prompt_s"], "band_keep_prompt_s": coded["measured_prompt_s"],
                         "saving": saving, "ring_error": err, "fp8_ring_error": fp8,
                         "offline_ring_error": (coded.get("offline") or {}).get("ring"),
                         "commands": [_ring_command(ctx, "none"), _ring_command(ctx, "freq-keep-k")]})


ROWS = (
    Row(Candidate("ring-attention", "KV blocks passed round a ring of n ranks, a codec on every hop",
              "band-keep (freq-keep-k, DCT, keep 0.5; model/catalog/codecs.py), once per hop",
              "attention-output error after the ring's hops no worse than the equal-bytes baseline's (fp8)"),
        link="ib-ndr", order=4, run=row_ring_attention),
)
