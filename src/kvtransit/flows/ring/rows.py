"""Ring attention's row of the candidate table: `kvtransit ring`, 4 ranks passing the real-KV sample's blocks round a
shaped ring, raw and with band-keep on every hop; the measured prompt's time beyond its held attention (the held
attention is the model's: a modelled factor, tagged). Precision: band-keep's task-level loss on the real model
(docs/results/accuracy.json), a floor for the ring, whose hops apply it again; the live ring's output error against
fp8's as context. Regime: ring size × link, by flows/ring/model.py."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

from kvtransit.harness.studies.candidates.rows import (
    SAMPLE_TEXT,
    DeckVerdict,
    Row,
    RowContext,
    RowRun,
    budget_flag,
    faithful_runs,
    links,
    load_real_kv,
    small_report,
)
from kvtransit.harness.studies.candidates.table import NOT_A_CANDIDATE, Candidate, PrecisionFigure, RowMeasured
from kvtransit.model.catalog.links import LINKS, link_by_name
from kvtransit.model.judge.five_tests import BOTTLENECK_MIN_SHARE, PrecisionMeasured

# Ring attention as the offline row had it (docs/reference.md §7's long context): llama3-8b on h100, 4 ranks of 4,096
# tokens (a 16k prompt), raw and with band-keep on every hop; 3 prompts, the first a warm-up.
RING_RUN: dict[str, Any] = dict(model="llama3-8b", n=4, block_tokens=4096, prompts=3)
RING_BAND_KEEP: dict[str, Any] = {"keep": 0.5, "sinks": 4}
# The regime's grid: the ring sizes docs/reference.md §7.6 names, on the links from Ethernet to NVLink.
RING_SIZES = (2, 4, 8)
RING_LINKS = ("eth-25g", "eth-100g", "ib-ndr", "nvlink4")


def _ring(ctx: RowContext, codec: str) -> tuple[Any, dict[str, Any]]:
    from kvtransit.flows.ring.run import offline_errors, plan_ring, run_ring
    from kvtransit.model.catalog.devices import device_by_name
    from kvtransit.model.catalog.models import model_by_name
    from kvtransit.model.module.budget import Module

    u = ctx.unknowns
    n = _ring_size(ctx)
    params = dict(RING_BAND_KEEP) if codec != "none" else {}
    if codec != "none" and u.precision_bits is not None:
        params["precision_bits"] = u.precision_bits
    plan = plan_ring(model_by_name(RING_RUN["model"]), device_by_name("h100"), link_by_name(ctx.link),
                     n=n, context=n * RING_RUN["block_tokens"], sample=str(ctx.sample_path),
                     text=SAMPLE_TEXT, codec=codec, codec_params=params, module=Module(ops_per_byte=u.module_budget),
                     prompts=RING_RUN["prompts"], transform_charged=bool(u.transform_charged))
    report = asyncio.run(run_ring(plan))
    report.offline = offline_errors(plan)
    summary = report.summary()
    (ctx.run_dir / f"ring-{codec}.json").write_text(json.dumps(summary, indent=1, default=str))
    return report, summary


def _ring_size(ctx: RowContext) -> int:
    return int(ctx.setting("n", RING_RUN["n"]))


def _ring_command(ctx: RowContext, codec: str) -> str:
    u = ctx.unknowns
    n = _ring_size(ctx)
    argv = (f"kvtransit ring --model {RING_RUN['model']} --ring-ranks {n} "
            f"--ring-prompt {n * RING_RUN['block_tokens']} --ring-link {ctx.link} --codec {codec} "
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
        return ring_share(model, device, link, tokens, n)

    sample = load_real_kv(ctx)
    fp8 = error_after_hops(sample.q, sample.q_positions, sample.k, sample.v, n, wire_codec("fp8")).ring
    acc = coded.get("accuracy") or {}
    err = acc.get("out_err_ring") if coded_report.ok else None
    saving = (1 - coded["measured_prompt_s"] / raw["measured_prompt_s"]
              if raw_report.ok and coded_report.ok else math.nan)
    from kvtransit.harness.studies.candidates.kv_rows import task_losses
    from kvtransit.model.scenario import Scenario

    band_keep = Scenario.build(codec="freq-keep-k", **RING_BAND_KEEP)  # the codec setting the hops run
    row = RowMeasured(
        ctx.name, coded_report.plan.declaration, share,
        f"the raw prompt's time beyond its blockwise attention (link time not hidden), ring of {n}, {tokens:,}-token "
        f"blocks of {model.name}", share_by_link={name: share_on(link) for name, link in links().items()},
        link=ctx.link, link_bytes=float(ring.block_bytes(model, tokens)), share_whole="a prompt",
        budget_ops_per_byte=ctx.unknowns.module_budget,
        precision=PrecisionFigure(err, fp8, f"attention-output error of the live ring of {n} (band-keep on every hop, "
                                  "each block as far as it travelled) vs fp8's at equal bytes",
                                  at_bits=ctx.unknowns.precision_bits),
        task_losses=task_losses(band_keep), precision_measured=PrecisionMeasured(0, None, None),
        streams=1.0 if coded_report.ok else None, streams_as="streams per hop (a rank sends to its neighbour)",
        streams_counted=False, compute_basis="modelled: the h100 roofline's blockwise attention, held on the clock",
        share_factor=("the ranks' blockwise attention, subtracted from the measured prompt, is the model's "
                      "(flows/ring/model.py), held on the clock"),
        notes=((f"precision: band-keep's task-level loss on SmolLM2 applied once (docs/results/accuracy.json), a floor "
                f"for the ring, which applies it on every hop; the live ring's attention-output error "
                f"{_num(err)} against fp8's {_num(fp8)} at equal bytes (context)"),))
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
                         "commands": [_ring_command(ctx, "none"), _ring_command(ctx, "freq-keep-k")]},
                  evidence={"raw ring": small_report(raw), "band-keep ring": small_report(coded)})


def _num(value: Any) -> str:
    return "-" if value is None else f"{value:.3g}"


def ring_share(model: Any, device: Any, link: Any, tokens: int, n: int) -> float:
    """The prompt's time beyond its blockwise attention, by flows/ring/model.py: a layer is the own block's compute
    and n − 1 hops of max(link, compute), so 1 − n·compute / layer (the figure the live row measures)."""
    from kvtransit.flows.ring import model as ring

    h = ring.hop(model, device, link, tokens)
    return max(0.0, 1 - n * h.compute_s / ring.layer_s(model, device, link, tokens, n))


def _ring_model(ctx: RowContext, _own: RowRun, n: int, link_name: str) -> Any:
    from kvtransit.harness.studies.candidates.regimes import PointModel
    from kvtransit.model.catalog.devices import device_by_name
    from kvtransit.model.catalog.models import model_by_name

    share = ring_share(model_by_name(RING_RUN["model"]), device_by_name("h100"), link_by_name(link_name),
                       RING_RUN["block_tokens"], n)
    return PointModel(share, {"bottleneck": share >= BOTTLENECK_MIN_SHARE})


def _ring_regime() -> Any:
    from kvtransit.harness.studies.candidates.regimes import Axis, Regime

    return Regime(Axis("n", "ring size (ranks)", RING_SIZES, "ranks"),
                  Axis("link", "link", RING_LINKS, choices=tuple(LINKS)), _ring_model,
                  f"flows/ring/model.py: {RING_RUN['block_tokens']:,}-token blocks of {RING_RUN['model']} a rank, the "
                  "prompt's time beyond its blockwise attention",
                  home=lambda ctx: (_ring_size(ctx), ctx.link))


def ring_spec() -> Any:
    from kvtransit.flows.ring import model as ring
    from kvtransit.harness.studies.candidates.kv_rows import ACCURACY_RESULTS
    from kvtransit.harness.studies.candidates.spec import codec_case
    from kvtransit.model.catalog.devices import device_by_name
    from kvtransit.model.catalog.models import model_by_name

    model, tokens = model_by_name(RING_RUN["model"]), RING_RUN["block_tokens"]
    compute = ring.block_attention_s(model, device_by_name("h100"), tokens)
    return codec_case(f"one ring hop of a {tokens:,}-token block (one layer's K and V)", RING_RUN["model"], tokens,
                      "ib-ndr", input_bytes=float(ring.block_bytes(model, tokens)), bits_from=ACCURACY_RESULTS,
                      overlap_s=compute, kernel_note="a hop takes max(link, the block's attention)")


ROWS = (
    Row(Candidate("ring-attention", "KV blocks passed round a ring of n ranks, a codec on every hop",
              "band-keep (freq-keep-k, DCT, keep 0.5; model/catalog/codecs.py), once per hop",
              "band-keep's task-level loss on a real model within +1 % perplexity (docs/results/accuracy.json), a "
              "floor for the ring's hops; the live ring's error against fp8's as context"),
        link="ib-ndr", order=4, run=row_ring_attention,
        deck=DeckVerdict(NOT_A_CANDIDATE, "pays only when the link is slower than the attention block"),
        regime=_ring_regime(), spec=ring_spec),
)
