"""A whole run under load: `Launcher` (what `kvtransit up` runs) with hundreds of small requests on loopback.

Every process is the real one (decode, middlebox with band-keep, prefill, load generator), at a small scale
and a rate the box can keep up with. Pinned: every request ends ok, no process's memory keeps growing once
the run is warm, and the hand-off p99 stays near what the model says (latency + wire bytes / bandwidth).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time

import pytest

from kvtransit.harness.up.launcher import Launcher
from kvtransit.model.scenario import Scenario

from ._peers import RssSampler, percentile

pytestmark = [pytest.mark.load, pytest.mark.timeout(180)]

# 300 requests at 8 req/s (~38 s of arrivals) of short prompts and outputs, at scale 0.025 (llama3-8b's KV
# cut to 26 of its 1,024 channels, the link rate with it), so the box keeps up (the link is ~18 % busy) and
# the run is about the processes, not the host's limits.
SCENARIO = Scenario(requests=300, rate=8.0, prompt_mean=512.0, prompt_cv=0.5, output_mean=16.0, output_cv=0.5,
                    scale=0.025, dilation=1.0)
WARM_FRACTION = 0.25  # of the arrival span: caches, pools and batches have reached their working size by then
# Per process, from warm to the end (a quiet box: under 1 MiB for decode, middlebox and loadgen, 5-8 MiB for
# the prefill). Decode's KV reservation and the middlebox's in-flight bytes follow the load; a leak of a few
# KiB per request would stay under it, a leak per chunk or per token would not.
RSS_GROWTH_BOUND = 32 * 2**20


@pytest.fixture(scope="module")
def whole_run(tmp_path_factory):
    report_path = tmp_path_factory.mktemp("whole-run") / "report.json"
    launcher = Launcher(SCENARIO, figures=False, report_path=report_path, drain_timeout_s=30.0, accuracy_sample=4,
                        links="loopback", log=lambda _msg: None)
    sampler = RssSampler(lambda: {c.name: c.pid for c in launcher.children if c.pid is not None})

    async def run() -> float:
        stop_sampling = asyncio.Event()
        sampling = asyncio.create_task(sampler.run(stop_sampling))
        started = time.monotonic()
        try:
            assert await launcher.run() == report_path
        finally:
            stop_sampling.set()
            await sampling
        return started

    started = asyncio.run(run())
    # Arrivals start once the load generator is up; the warm mark is a quarter of their span after the start of
    # the loadgen's samples (the last process to start).
    loadgen_first = min(t for t, _ in sampler.samples["loadgen-0"])
    warm_at = max(started, loadgen_first) + WARM_FRACTION * SCENARIO.requests / SCENARIO.rate * SCENARIO.dilation
    return json.loads(report_path.read_text()), sampler, warm_at


def test_every_request_of_the_run_is_ok(whole_run):
    report, _, _ = whole_run
    requests = report["requests"]
    assert requests["total"] == SCENARIO.requests
    assert requests["failed"] == 0 and requests["timed_out"] == 0, requests
    assert requests["ok"] + requests["slo_miss"] == SCENARIO.requests, requests
    assert all(r["outcome"] in ("ok", "slo-miss") for r in report["per_request"])


def test_no_process_memory_keeps_growing_once_the_run_is_warm(whole_run):
    _, sampler, warm_at = whole_run
    assert {"decode-0", "middlebox-0", "prefill-0", "loadgen-0"} <= set(sampler.samples)
    grown = {}
    for name in sampler.samples:
        warm, peak = sampler.growth_after(name, warm_at)
        grown[name] = (peak - warm) / 2**20
    assert all(mib < RSS_GROWTH_BOUND / 2**20 for mib in grown.values()), f"MiB grown after warm-up: {grown}"


def test_handoff_p99_stays_near_the_model_under_load(whole_run):
    report, _, _ = whole_run
    link, model = SCENARIO.link_spec, SCENARIO.model_spec
    compression = report["link"]["kv_bytes"] / report["link"]["wire_bytes"]  # the codec's, over the whole run
    measured, modelled = [], []  # model seconds, per request that had a hand-off
    for r in report["per_request"]:
        if r["handoff_s"] is not None:
            measured.append(r["handoff_s"])
            modelled.append(link.latency_s + model.kv_bytes(r["prompt_tokens"]) / compression / link.bandwidth_Bps)
    assert len(measured) >= SCENARIO.requests * 0.9  # single-token outputs have no hand-off
    median = statistics.median(m / w for m, w in zip(measured, modelled, strict=True))
    tail = percentile(measured, 99) / percentile(modelled, 99)
    # Loose (a quiet box: median 1.04, p99 over the model's p99 1.18): at 8 req/s a hand-off now and then
    # waits behind another on the link, which the model of one hand-off alone does not count. The p99 of the
    # per-request ratios is not held: a small hand-off queued behind a large one has a large ratio by design.
    near_the_model = 0.8 < median < 1.5 and tail < 2.0
    # The product's promise is not "always near the model" but "near the model, or the run says it is not
    # faithful": on a CI box starved of CPU the hand-offs once took 1.92x, and then the report's own checks
    # must have said so (a far-off run that still claims to be faithful is the bug this test is for).
    failing = {name: check["hint"] for name, check in report["fidelity"].items() if not check["ok"]}
    assert near_the_model or (not report["faithful"] and failing), (median, tail, report["fidelity"])
    assert report["faithful"] == (not failing)
