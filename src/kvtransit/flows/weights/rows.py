"""Weight streaming's row of the candidate table: `kvtransit weights`, a store and an instance: the cold start, then
adapters paged in on demand; the adapter waits' measured share of TTFT, every byte checked against what was sent."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from kvtransit.harness.studies.candidates.rows import Row, RowContext, RowRun, faithful_runs, links
from kvtransit.harness.studies.candidates.table import LINE_INPUT, Candidate, PrecisionFigure, RowMeasured
from kvtransit.model.catalog.links import link_by_name

# Weight streaming as the offline row had it: llama3-8b's cold start, then rank-16 adapters (S-LoRA's smallest common
# rank), 100 of them by Zipf, 8 resident, for 2,048-token prompts; 12 requests at 4 req/s (a short run); at most
# 32 MB of weights on the wire (the share is a ratio of times: the scale does not move it).
WEIGHTS_RUN: dict[str, Any] = dict(model="llama3-8b", rank=16, adapters=100, capacity=8, requests=12, rate=4.0,
                                   prompt_tokens=2048)
WEIGHTS_RUN_MAX_BYTES = 32e6


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
    faithful = faithful_runs({"the weight flow": s})
    row = RowMeasured(
        ctx.name, replace(decl, precision_bits=None), share,
        f"adapter paging: load waits / TTFT, {WEIGHTS_RUN['adapters']} rank-{WEIGHTS_RUN['rank']} adapters, Zipf, "
        f"{WEIGHTS_RUN['capacity']} resident", share_by_link={n: share_on(k) for n, k in links().items()},
        link=ctx.link, share_whole="TTFT", link_bytes=float(shape.nbytes), line=LINE_INPUT,
        precision=PrecisionFigure(error, 0.0, measured_as, required_bits=16),
        streams=1.0 if report.ok else None, streams_as="streams (one adapter to one instance)", streams_counted=False,
        notes=(("kernel none moves no byte off the link (ratio 1): the lossless compressor a user would try (zstd, "
                "1.28 on BF16 weights, `kvtransit weights --codec zstd --policy host`) branches on the data "
                "(comparison), which the module does not publish"),
               "required bits 16: a BF16 weight (model/module/budget.py: flow_check)"))
    command = (f"kvtransit weights --model {WEIGHTS_RUN['model']} --link {ctx.link} --rank {WEIGHTS_RUN['rank']} "
               f"--adapters {WEIGHTS_RUN['adapters']} --adapter-capacity {WEIGHTS_RUN['capacity']} --requests "
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


ROWS = (
    Row(Candidate("weight-streaming", "BF16 weights or a LoRA adapter paged to an instance",
              "none (lossless; model/module/budget.py: flow_check refuses a lossy kernel)",
              "bit-exact (lossless only, docs/reference.md §7)"),
        link="eth-25g", order=7, run=row_weight_streaming),
)
