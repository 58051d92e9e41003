"""Offered load against the modelled system's capacity: does a workload overload it before the run starts?

A replay that asks more of the modelled GPUs or link than they can serve ends with queues that grow for the
whole run (timeouts, an SLO attainment near 0 %), however faithfully the testbed emulates it; `kvtransit up`
says so before it starts. The check is first-order, from the request stream alone (arrival, prompt and output
lengths), per stage of docs/reference.md §3–§4:

- **prefill**: each request costs its share of a full batch of prompts of its own length (FIFO batches of at
  most `PREFILL_BATCH_TOKEN_LIMIT` tokens), held for the roofline step time (`cost.prefill_step_s`); a ring
  request a flow plans itself its own cost (model/sections.py: `Section.prefill_seconds`; a ring request, its
  whole ring prefill);
- **decode**: the tokens it must make (output − 1: the first comes from prefill) against the throughput of a
  full continuous batch (as many sequences as `MAX_DECODE_BATCH` and the KV capacity allow, each at the mean
  prompt plus half the mean output of context) on each instance;
- **link**: each hand-off's wire bytes (the full-size KV ÷ the codec's ratio) at the modelled link's rate, on
  each of its channels (KV-pool fetches are not counted).

A stage's utilisation is the busy time the workload asks of it per second of arrivals, over its instances;
above 1 its queue only grows. Its capacity is the arrival rate of this same mix that would fill it exactly.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from kvtransit.model.catalog.devices import Device
from kvtransit.model.catalog.models import ModelSpec
from kvtransit.model.cost.roofline import decode_step_s, prefill_step_s
from kvtransit.model.scenario import Scenario
from kvtransit.model.sections import Section
from kvtransit.model.serving.policies import MAX_DECODE_BATCH, PREFILL_BATCH_TOKEN_LIMIT
from kvtransit.model.serving.workload import RequestSpec

STAGES = ("prefill", "decode", "link")


@dataclass(frozen=True)
class LoadCheck:
    """The offered load of one request stream and, per stage, its utilisation and capacity (requests/s)."""

    requests: int
    span_s: float  # first to last arrival, model seconds
    offered_rps: float | None  # (requests − 1) / span, as the trace replay's `mean_rate_rps`; None: no span
    utilisation: dict[str, float | None]
    capacity_rps: dict[str, float | None]
    open_loop: bool  # False with max_concurrency > 0: the client waits for a free slot, so nothing piles up

    @property
    def bottleneck(self) -> str | None:
        known = {stage: u for stage, u in self.utilisation.items() if u is not None}
        return max(known, key=known.__getitem__) if known else None

    @property
    def overloaded(self) -> bool:
        stage = self.bottleneck
        return self.open_loop and stage is not None and (self.utilisation[stage] or 0.0) > 1.0

    def as_dict(self) -> dict[str, Any]:
        return {"requests": self.requests, "span_s": self.span_s, "offered_rps": self.offered_rps,
                "capacity_rps": dict(self.capacity_rps), "utilisation": dict(self.utilisation),
                "bottleneck": self.bottleneck, "open_loop": self.open_loop, "overloaded": self.overloaded}

    def warning(self) -> str | None:
        """One line for an overloaded open-loop run (None otherwise)."""
        stage = self.bottleneck
        if not self.overloaded or stage is None or self.offered_rps is None:
            return None
        busy = ", ".join(f"{s} {u:.0%}" for s, u in self.utilisation.items() if u is not None)
        return (f"overloaded: {self.offered_rps:.3g} req/s offered, but the modelled {stage} serves about "
                f"{self.capacity_rps[stage]:.3g} req/s of this mix (busy: {busy}); its queue grows for the whole "
                "run, so expect timeouts and SLO misses (lower --rate or raise --time-scale, or add instances)")


@lru_cache(maxsize=4096)
def prefill_share_s(model: ModelSpec, device: Device, gpus: int, prompt_tokens: int) -> float:
    """Seconds of one prefill instance a prompt costs, batched with prompts of its own length."""
    batch = max(1, PREFILL_BATCH_TOKEN_LIMIT // prompt_tokens)
    return prefill_step_s(model, device, gpus, [prompt_tokens] * batch) / batch


def decode_tokens_per_s(model: ModelSpec, device: Device, gpus: int, kv_capacity_tokens: int,
                        mean_prompt: float, mean_output: float) -> float:
    """Tokens a second one decode instance makes with its batch full (the most it can make of this mix)."""
    batch = max(1, min(MAX_DECODE_BATCH, math.floor(kv_capacity_tokens / (mean_prompt + mean_output))))
    context = round(batch * (mean_prompt + mean_output / 2))  # tokens so far grow from 1 to the output length
    return batch / decode_step_s(model, device, gpus, batch, context)


def _prefill_seconds(scenario: Scenario, sections: Sequence[Section], request: RequestSpec) -> float:
    """What `request` costs its prefill instance: a flow's own figure for it (a ring request holds its instance for
    its whole ring prefill), else its share of a batch of prompts of its own length."""
    for section in sections:
        seconds = section.prefill_seconds(scenario, request)
        if seconds is not None:
            return seconds
    return prefill_share_s(scenario.model_spec, scenario.device_spec, scenario.prefill_gpus, request.prompt_tokens)


def offered_vs_capacity(scenario: Scenario, requests: Sequence[RequestSpec]) -> LoadCheck:
    """The load `requests` (the run's, in arrival order) offer the scenario's modelled system."""
    open_loop = scenario.max_concurrency == 0
    n = len(requests)
    span = (max(r.arrival_s for r in requests) - min(r.arrival_s for r in requests)) if requests else 0.0
    if n < 2 or span <= 0:  # no rate to judge (one request, or all at once)
        none: dict[str, float | None] = dict.fromkeys(STAGES)
        return LoadCheck(n, span, None, none, dict(none), open_loop)
    rate = (n - 1) / span
    # A TP group's instance on its own GPUs; its collectives are left out (a first-order check, said before a run).
    model, device = scenario.model_spec, scenario.device_spec
    sections = scenario.enabled_sections
    prefill_s = math.fsum(_prefill_seconds(scenario, sections, r) for r in requests)
    decode_tokens = sum(r.output_tokens - 1 for r in requests)
    decode_rate = decode_tokens_per_s(model, device, scenario.decode_gpus, scenario.decode_kv_capacity_tokens,
                                      sum(r.prompt_tokens for r in requests) / n,
                                      sum(r.output_tokens for r in requests) / n)
    ratio = scenario.codec_declaration.ratio if scenario.codec != "none" else 1.0
    link = scenario.link_spec
    link_s = math.fsum(model.kv_bytes(r.prompt_tokens) / ratio for r in requests) / link.bandwidth_Bps
    # busy seconds per request, per instance of the stage
    per_request = {"prefill": prefill_s / n / scenario.prefill,
                   "decode": decode_tokens / decode_rate / n / scenario.decode,
                   "link": link_s / n / scenario.channels}
    utilisation: dict[str, float | None] = {s: rate * per_request[s] for s in STAGES}
    capacity: dict[str, float | None] = {s: (1 / per_request[s]) if per_request[s] > 0 else None for s in STAGES}
    return LoadCheck(n, span, rate, utilisation, capacity, open_loop)
