"""The candidate table's row whose flow is not live in kvtransit yet (weight streaming): the kernel measured offline
on real BF16 bytes, the bottleneck and placement from the model on every catalogued link, and the row saying which
is which. The live rows and the harness are emulator/candidates.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from kvtransit.model.candidates import LINE_INPUT, PrecisionFigure, RowMeasured
from kvtransit.model.link_catalog import LINKS

from .candidates import RowContext, RowRun

# The modelled row's operating point: llama3-8b on one h100, adapters of rank 16 (S-LoRA's smallest common rank),
# 100 of them with Zipf popularity, 8 resident, over 200 requests of 2,048-token prompts.
MODELLED_MODEL, MODELLED_DEVICE = "llama3-8b", "h100"
ADAPTER_RANK, ADAPTERS, ADAPTERS_RESIDENT, ADAPTER_REQUESTS, ADAPTER_PROMPT_TOKENS = 16, 100, 8, 200, 2048


def _shares_by_link(share_of_link: Callable[[Any], float]) -> dict[str, float]:
    return {name: share_of_link(link) for name, link in LINKS.items()}


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
    "weight-streaming": row_weight_streaming,
}
