"""The candidate table's rows whose flow is not live in kvtransit yet (query-aware selection, ring attention,
weight streaming): the kernel measured offline on real data (the real-KV sample, BF16 bytes), the bottleneck and
placement from the model on every catalogued link, and each row saying which is which. The live rows and the harness
are emulator/candidates.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from kvtransit.model.candidates import LINE_INPUT, PrecisionFigure, RowMeasured
from kvtransit.model.five_tests import equal_bytes_baseline
from kvtransit.model.link_catalog import LINKS

from .candidates import RowContext, RowRun, bits_flag, load_real_kv, relative_l2

# The modelled rows' operating point: llama3-8b on one h100, a 32k-token context (REFERENCE §7's long-context
# flows), a ring of 4 ranks of 4,096 tokens each, adapters of rank 16 (S-LoRA's smallest common rank), 100 of them
# with Zipf popularity, 8 resident, over 200 requests of 2,048-token prompts.
MODELLED_MODEL, MODELLED_DEVICE, MODELLED_CONTEXT = "llama3-8b", "h100", 32768
RING_N, RING_BLOCK_TOKENS = 4, 4096
ADAPTER_RANK, ADAPTERS, ADAPTERS_RESIDENT, ADAPTER_REQUESTS, ADAPTER_PROMPT_TOKENS = 16, 100, 8, 200, 2048
SELECTION_BUDGET = 0.25  # a quarter of the pages (Quest's usual budget; docs/results/selection.md's 1/4 row)
SELECTION_SINK_PAGES = 1  # page 0 kept (the attention sinks, REFERENCE §6; the better rows of selection.md)


def _shares_by_link(share_of_link: Callable[[Any], float]) -> dict[str, float]:
    return {name: share_of_link(link) for name, link in LINKS.items()}


def row_query_aware_selection(ctx: RowContext) -> RowRun:
    from kvtransit.kernels import selection as sel
    from kvtransit.kernels.ring_attention import full_attention, wire_codec
    from kvtransit.model.catalog import model_by_name
    from kvtransit.model.cost import decode_step_s
    from kvtransit.model.devices import device_by_name
    from kvtransit.model.selection import SelectionStep, scoring_declaration

    model, device = model_by_name(MODELLED_MODEL), device_by_name(MODELLED_DEVICE)
    context = MODELLED_CONTEXT
    step_s = decode_step_s(model, device, 1, 1, context)
    everything = SelectionStep(model, context)

    def share_on(link: Any) -> float:
        fetch = everything.fetch_time_s(link)
        return fetch / (fetch + step_s)

    shares = _shares_by_link(share_on)
    u = ctx.unknowns
    sample = load_real_kv(ctx)
    q, k, v, pos = sample.q, sample.k, sample.v, sample.q_positions
    quality = sel.evaluate_selection(q, k, v, pos, SELECTION_BUDGET, kind="mean", precision_bits=u.precision_bits,
                                     sink_pages=SELECTION_SINK_PAGES)
    ratio = SelectionStep(model, context, SELECTION_BUDGET).reduction
    baseline = equal_bytes_baseline(ratio)
    codec = wire_codec(baseline)
    exact = full_attention(q, pos, k, v)
    base_err = relative_l2(exact, full_attention(q, pos, codec(k, 0), codec(v, 0)))
    row = RowMeasured(
        ctx.name, scoring_declaration(model, "mean"), shares[ctx.link],
        f"fetching the context's KV each decode step / (fetch + step), {model.name} at {context} tokens",
        share_by_link=shares, link=ctx.link, link_bytes=float(everything.all_kv_bytes), share_modelled=True,
        share_whole="a decode step",
        line=LINE_INPUT, precision=PrecisionFigure(
            quality.output_error, base_err, f"attention-output error, budget {SELECTION_BUDGET:g} of the pages "
            f"(sink page kept) vs {baseline} at equal bytes (ratio {ratio:.2f})", at_bits=u.precision_bits),
        streams=1.0, streams_modelled=True, streams_as="streams scored (one context's summaries)")
    return RowRun(row, None, None, "n/a: offline kernels + the model", "kvtransit accuracy --select"
                  + bits_flag(u), None,
                  measured_what=f"the selection's recall ({quality.recall:.3f}) and output error on the real-KV "
                                f"sample ({ctx.sample_path.name}), scored at "
                                f"{'exact' if u.precision_bits is None else f'{u.precision_bits} bits'}",
                  modelled_what="the bottleneck (model/selection.py: bytes per step over the link vs the decode step, "
                                "model/cost.py) and placement: selection is not a live flow in kvtransit yet",
                  extra={"recall": quality.recall, "output_error": quality.output_error, "baseline": baseline,
                         "baseline_error": base_err, "reduction": ratio})


def row_ring_attention(ctx: RowContext) -> RowRun:
    from kvtransit.kernels.ring_attention import error_after_hops, wire_codec
    from kvtransit.model import ring
    from kvtransit.model.catalog import model_by_name
    from kvtransit.model.codecs import codec_declaration
    from kvtransit.model.devices import device_by_name

    model, device = model_by_name(MODELLED_MODEL), device_by_name(MODELLED_DEVICE)
    n, tokens = RING_N, RING_BLOCK_TOKENS

    def share_on(link: Any) -> float:
        h = ring.hop(model, device, link, tokens)
        return max(0.0, h.link_s - h.compute_s) / h.total_s  # the part of a hop the compute does not hide

    shares = _shares_by_link(share_on)
    u = ctx.unknowns
    sample = load_real_kv(ctx)
    q, k, v, pos = sample.q, sample.k, sample.v, sample.q_positions
    params: dict[str, Any] = {"keep": 0.5, "sinks": 4}
    if u.precision_bits is not None:
        params["precision_bits"] = u.precision_bits
    err = error_after_hops(q, pos, k, v, n, wire_codec("freq-keep-k", **params)).ring
    base = error_after_hops(q, pos, k, v, n, wire_codec("fp8")).ring
    decl = codec_declaration("freq-keep-k")
    row = RowMeasured(
        ctx.name, decl, shares[ctx.link], f"a hop's link time the block's attention does not hide, ring of {n}, "
        f"{tokens}-token blocks of {model.name}", share_by_link=shares, link=ctx.link,
        link_bytes=float(ring.block_bytes(model, tokens)), share_modelled=True, share_whole="a hop",
        precision=PrecisionFigure(err, base, f"attention-output error of the ring of {n} (each block as far as it "
                                  "travelled) vs fp8's at equal bytes", at_bits=u.precision_bits),
        streams=1.0, streams_modelled=True, streams_as="streams per hop (a rank sends to its neighbour)")
    return RowRun(row, None, None, "n/a: offline kernels + the model", "kvtransit accuracy --ring" + bits_flag(u),
                  None, measured_what=f"the ring's output error with band-keep on every hop and fp8's, on the real-KV "
                  f"sample ({ctx.sample_path.name})", modelled_what="the bottleneck (model/ring.py: a hop's link leg "
                  "vs the block's attention) and placement: ring attention is not a live flow in kvtransit yet",
                  extra={"ring_error": err, "fp8_ring_error": base})


def row_weight_streaming(ctx: RowContext) -> RowRun:
    import ml_dtypes

    from kvtransit.kernels.registry import get_codec
    from kvtransit.model.catalog import model_by_name
    from kvtransit.model.codecs import codec_declaration
    from kvtransit.model.cost import prefill_step_s
    from kvtransit.model.devices import device_by_name
    from kvtransit.model.errors import ConfigError
    from kvtransit.model.module import flow_check
    from kvtransit.model.weights import AdapterShape, ZipfPopularity, adapter_wait_s, page_adapters

    model, device = model_by_name(MODELLED_MODEL), device_by_name(MODELLED_DEVICE)
    shape = AdapterShape(model, ADAPTER_RANK)
    accesses = page_adapters(ZipfPopularity(ADAPTERS).draws(ADAPTER_REQUESTS),
                             ADAPTERS_RESIDENT)
    ttft = prefill_step_s(model, device, 1, [ADAPTER_PROMPT_TOKENS])

    def share_on(link: Any) -> float:
        wait = sum(adapter_wait_s(accesses, shape, link))
        return wait / (wait + len(accesses) * ttft)

    shares = _shares_by_link(share_on)
    u = ctx.unknowns
    decl = replace(codec_declaration("none"), name="none (lossless)", lossless=True, precision_bits=u.precision_bits)
    try:
        flow_check(decl, "weights")
        # The kernel on BF16 weight bytes: what comes out must be what went in, bit for bit.
        rng = np.random.default_rng(0)
        weights = (rng.standard_normal((64, 4096)) * 0.02).astype(ml_dtypes.bfloat16)
        codec = get_codec("none")
        enc = codec.encode(weights)
        back = np.asarray(codec.decode(enc.header, enc.payload))
        error: float | None = float(np.count_nonzero(back.view(np.uint16) != weights.view(np.uint16)))
        measured_as = "BF16 weight values not returned bit for bit by the kernel"
    except ConfigError as exc:
        error, measured_as = 1.0, f"refused: {exc}"
    row = RowMeasured(
        ctx.name, replace(decl, precision_bits=None), shares[ctx.link],
        f"adapter paging: load waits / (waits + TTFT), {ADAPTERS} rank-{ADAPTER_RANK} "
        f"adapters, Zipf, {ADAPTERS_RESIDENT} resident", share_by_link=shares, link=ctx.link, share_whole="TTFT",
        link_bytes=float(shape.nbytes), share_modelled=True, line=LINE_INPUT,
        precision=PrecisionFigure(error, 0.0, measured_as, required_bits=16),
        streams=1.0, streams_modelled=True, streams_as="streams (one adapter to one instance)",
        notes=(("kernel none moves no byte off the link (ratio 1): the lossless compressor a user would try (zstd, "
               "1.28–1.46 on SmolLM2's BF16 weights, docs/results/weights.md) branches on the data (comparison), "
               "which the module does not publish"), "required bits 16: a BF16 weight (model/module.py: flow_check)"))
    return RowRun(row, None, None, "n/a: offline kernel + the model", "kvtransit candidates --only weight-streaming",
                  None, measured_what="the kernel's exactness on BF16 bytes, flow_check's refusal of a lossy kernel",
                  modelled_what="the bottleneck (model/weights.py adapter paging over the link vs the prefill, "
                                "model/cost.py) and placement: weight streaming is not a live flow in kvtransit yet",
                  extra={"adapter_bytes": shape.nbytes, "miss_rate": sum(not a.hit for a in accesses) / len(accesses),
                         "ttft_model_s": ttft})


OFFLINE_ROWS: dict[str, Callable[[RowContext], RowRun]] = {
    "query-aware-selection": row_query_aware_selection, "ring-attention": row_ring_attention,
    "weight-streaming": row_weight_streaming,
}
