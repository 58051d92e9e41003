"""Weight streaming's row of the candidate table: `kvtransit weights`, a store and an instance: the cold start, then
adapters paged in on demand; the adapter waits' measured share of TTFT, every byte checked against what was sent.
The cold start is judged against the serving time it is amortised over (`SERVING_S`, stated) and shown beside the
adapters' share. Its kernel is the identity (none): the row is "no kernel" whatever its tests say. Regime: adapters ×
resident capacity, by the weight flow's own model (flows/weights/model.py: serve_adapter_requests)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from kvtransit.harness.studies.candidates.rows import (
    DeckVerdict,
    Row,
    RowContext,
    RowRun,
    faithful_runs,
    links,
    small_report,
)
from kvtransit.harness.studies.candidates.table import (
    LINE_INPUT,
    NOT_A_CANDIDATE,
    Candidate,
    PrecisionFigure,
    RowMeasured,
)
from kvtransit.model.catalog.links import link_by_name
from kvtransit.model.judge.five_tests import BOTTLENECK_MIN_SHARE

# Weight streaming as the offline row had it: llama3-8b's cold start, then rank-16 adapters (S-LoRA's smallest common
# rank), 100 of them by Zipf, 8 resident, for 2,048-token prompts; 12 requests at 4 req/s (a short run); at most
# 32 MB of weights on the wire (the share is a ratio of times: the scale does not move it).
WEIGHTS_RUN: dict[str, Any] = dict(model="llama3-8b", rank=16, adapters=100, capacity=8, requests=12, rate=4.0,
                                   prompt_tokens=2048)
WEIGHTS_RUN_MAX_BYTES = 32e6
# What a cold start is amortised over: an instance loads its weights once and then serves (the deck: "loaded once,
# amortised over hours"); one hour, a stated choice (a longer life only shrinks the share).
SERVING_S = 3600.0
# The regime's grid: adapters in the pool (S-LoRA serves thousands; the row's 100 in the middle) × the slots resident.
ADAPTER_COUNTS = (10, 25, 50, 100, 200, 400)
CAPACITIES = (2, 4, 8, 16, 32)


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
    settings = {"adapters": int(ctx.setting("adapters", WEIGHTS_RUN["adapters"])),
                "capacity": int(ctx.setting("capacity", WEIGHTS_RUN["capacity"]))}
    model, device, link = model_by_name(WEIGHTS_RUN["model"]), device_by_name("h100"), link_by_name(ctx.link)
    decl = replace(LOSSLESS_KERNELS["none"], name="none (lossless)", precision_bits=u.precision_bits)
    try:
        flow_check(decl, "weights")
        refused = None
    except ConfigError as exc:  # the run still measures the flow (kernel none), the precision test reads this
        refused = str(exc)
    scale = min(1.0, HOST_BUDGET_BPS / link.bandwidth_Bps, WEIGHTS_RUN_MAX_BYTES / model.resident_weight_bytes)
    run = {**{k: v for k, v in WEIGHTS_RUN.items() if k != "model"}, **settings}
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
    cold = s.get("cold_start_s")
    cold_text = (f"the cold start: {cold:.3g} s over {SERVING_S / 3600:g} h of serving = "
                 f"{cold / (cold + SERVING_S):.4%} (measured over a stated serving time)"
                 if isinstance(cold, int | float) else "the cold start: not measured")
    row = RowMeasured(
        ctx.name, replace(decl, precision_bits=None), share,
        f"adapter paging: load waits / TTFT, {settings['adapters']} rank-{WEIGHTS_RUN['rank']} adapters, Zipf, "
        f"{settings['capacity']} resident", share_by_link={n: share_on(k) for n, k in links().items()},
        link=ctx.link, share_whole="TTFT", link_bytes=float(shape.nbytes), line=LINE_INPUT,
        precision=PrecisionFigure(error, 0.0, measured_as, required_bits=16),
        streams=1.0 if report.ok else None, streams_as="streams (one adapter to one instance)", streams_counted=False,
        compute_basis="modelled: the h100 roofline's prefill, held on the clock", share_context=(cold_text,),
        notes=(("kernel none moves no byte off the link (ratio 1): the lossless compressor a user would try (zstd, "
                "1.28 on BF16 weights, `kvtransit weights --codec zstd --policy host`) branches on the data "
                "(comparison), which the module does not publish"),
               "required bits 16: a BF16 weight (model/module/budget.py: flow_check)"))
    command = (f"kvtransit weights --model {WEIGHTS_RUN['model']} --link {ctx.link} --rank {WEIGHTS_RUN['rank']} "
               f"--adapters {settings['adapters']} --adapter-capacity {settings['capacity']} --requests "
               f"{WEIGHTS_RUN['requests']} --rate {WEIGHTS_RUN['rate']:g} --prompt {WEIGHTS_RUN['prompt_tokens']} "
               f"--scale {scale:.4g} --json")
    return RowRun(row, scale, plan.dilation, faithful, command, str(ctx.run_dir),
                  measured_what="the cold start and every request's adapter wait and TTFT (a store and an instance "
                                "over a shaped link), every byte checked against what was sent",
                  modelled_what=("the prefill held on the clock (model/cost/roofline.py) and the share on other links "
                                 "(flips)"),
                  extra={"adapter_bytes": shape.nbytes, "misses": s.get("misses"), "hits": s.get("hits"),
                         "miss_ttft_error_median": s.get("miss_ttft_error_median"),
                         "cold_start_s": cold, "cold_start_error": s.get("cold_start_error"),
                         "serving_s": SERVING_S, "arrivals_s": list(plan.arrivals_s), "prefill_s": plan.prefill_s},
                  evidence={"weights": small_report(s)})


def _weights_model(ctx: RowContext, own: RowRun, adapters: int, capacity: int) -> Any:
    """The row's requests (its arrivals and prefill, the same Zipf draw for `adapters`) on an instance holding
    `capacity` adapters: load waits over TTFT (flows/weights/model.py)."""
    from kvtransit.flows.weights.model import AdapterShape, ZipfPopularity, pull_s, serve_adapter_requests
    from kvtransit.harness.studies.candidates.regimes import PointModel
    from kvtransit.model.catalog.models import model_by_name

    arrivals, prefill = own.extra.get("arrivals_s"), own.extra.get("prefill_s")
    if not arrivals or not isinstance(prefill, int | float):
        return PointModel(None, {"bottleneck": None}, "the row's run gave no arrivals")
    shape = AdapterShape(model_by_name(WEIGHTS_RUN["model"]), WEIGHTS_RUN["rank"])
    ids = ZipfPopularity(adapters, 1.0, 0).draws(len(arrivals))
    load = pull_s(shape.nbytes, link_by_name(ctx.link))
    served = serve_adapter_requests(arrivals, ids, capacity, [load] * len(ids), prefill)
    share = sum(m.wait_s for m in served) / sum(m.ttft_s for m in served)
    return PointModel(share, {"bottleneck": share >= BOTTLENECK_MIN_SHARE})


def _weights_regime() -> Any:
    from kvtransit.harness.studies.candidates.regimes import Axis, Regime

    return Regime(Axis("adapters", "adapters in the pool", ADAPTER_COUNTS, "adapters"),
                  Axis("capacity", "adapters resident", CAPACITIES, "resident"), _weights_model,
                  "flows/weights/model.py: the row's requests (Zipf, its arrivals and prefill) served FIFO with an "
                  "LRU of the resident adapters",
                  home=lambda ctx: (int(ctx.setting("adapters", WEIGHTS_RUN["adapters"])),
                                    int(ctx.setting("capacity", WEIGHTS_RUN["capacity"]))))


def weights_spec() -> Any:
    from kvtransit.harness.studies.candidates.spec import no_kernel_case

    return no_kernel_case("one rank-16 adapter's load", "eth-25g", "none (lossless)",
                          "its kernel is the identity: nothing to beat; a lossless one needs data-dependent ops "
                          "(zstd, 1.28: comparison), outside the module's set")


ROWS = (
    Row(Candidate("weight-streaming", "BF16 weights or a LoRA adapter paged to an instance",
              "none (lossless; model/module/budget.py: flow_check refuses a lossy kernel)",
              "bit-exact (lossless only, docs/reference.md §7)"),
        link="eth-25g", order=7, run=row_weight_streaming, deck=DeckVerdict(NOT_A_CANDIDATE, "weak"),
        regime=_weights_regime(), spec=weights_spec),
)
