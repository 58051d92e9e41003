"""The switch middlebox counts the streams it merged: n per sum, in /stats and in
`kvtransit_switch_merged_streams_total`, and judges the placement test from that count; over real loopback sockets
in-process for n = 2, 4, and as the real process `kvtransit collective --allreduce switch` starts
(`kvtransit middlebox --placement switch`)."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from kvtransit.flows.tp.metrics import switch_metrics
from kvtransit.flows.tp.rank.join import switch_member
from kvtransit.flows.tp.rank.rank import RankPlan, run_steps
from kvtransit.flows.tp.run import plan_collective, run_collective
from kvtransit.flows.tp.switch.server import SWITCH_STREAMS_MEASURED_AS, SwitchServer
from kvtransit.kernels.stream_sum import declaration as sum_declaration
from kvtransit.model.catalog.devices import DEVICES
from kvtransit.model.catalog.links import LINKS
from kvtransit.model.catalog.models import MODELS
from kvtransit.runtime.clock import MonotonicClock
from kvtransit.runtime.group_link.connect import close_channels

RATE = 45e9  # nvlink4 at dilation 10, scale 1 (as tests/integration/flows/tp/test_collectives.py)
LATENCY = 50e-6
DEADLINE_S = 3.0
STEPS, COLLECTIVES = 2, 3


@pytest.mark.parametrize("n", [2, 4])
async def test_the_switch_counts_n_merged_streams_a_sum_and_passes_the_placement_test(n):
    clock = MonotonicClock()
    registry = CollectorRegistry()
    server = SwitchServer(clock, group=1, size=n, rate_Bps=RATE, latency_s=LATENCY, deadline_s=DEADLINE_S,
                          declaration=sum_declaration(n), metrics=switch_metrics(registry))
    port = await server.start("127.0.0.1", 0)
    plans = [RankPlan(1, r, n, "switch", STEPS, COLLECTIVES, 256, compute_s=0.001, held_s=0.0, deadline_s=DEADLINE_S)
             for r in range(n)]
    algorithms = await asyncio.gather(*(switch_member(p, clock, "127.0.0.1", port, rate_Bps=RATE, latency_s=LATENCY)
                                        for p in plans))
    try:
        start = clock.now_ns() + 5_000_000
        results = await asyncio.gather(*(run_steps(p, clock, a, start) for p, a in zip(plans, algorithms, strict=True)))
    finally:
        for a in algorithms:
            await close_channels(a)
        await server.close()
    assert all(r.ok for r in results), [r.reason for r in results]
    sums = STEPS * COLLECTIVES
    assert registry.get_sample_value("kvtransit_switch_merged_streams_total") == n * sums
    stats = server.stats()
    assert (stats["sums"], stats["streams_merged"], stats["streams_per_sum"]) == (sums, n * sums, n)
    assert (stats["streams_declared"], stats["ingress_streams"], stats["placement"]) == (n, n, "switch")
    test = stats["placement_test"]
    assert test["passed"] is True and test["values"]["streams_measured"] == n
    assert SWITCH_STREAMS_MEASURED_AS in test["reason"]


async def test_a_switch_that_summed_nothing_has_its_placement_test_not_measured():
    server = SwitchServer(MonotonicClock(), group=1, size=2, rate_Bps=RATE, latency_s=LATENCY,
                          metrics=switch_metrics(CollectorRegistry()))
    test = server.stats()["placement_test"]
    assert test["passed"] is None and test["reason"].startswith("not measured")


@pytest.mark.slow
async def test_kvtransit_collective_s_switch_process_reports_the_streams_it_merged():
    # Light load: TP2 through the middlebox at placement switch (3 processes), per-step granularity, dilation 10.
    plan = plan_collective(MODELS["llama3-70b"], DEVICES["h100"], LINKS["nvlink4"], tp=2, allreduce="switch",
                           steps=3, scale=0.01, dilation=10)
    report = await run_collective(plan)
    assert report.ok, report.failures
    switch = report.summary()["switch"]
    assert (switch["sums"], switch["streams_merged"], switch["streams_per_sum"]) == (3, 6, 2)
    assert switch["placement_test"]["passed"] is True
    assert switch["kernel"] == "all-reduce-sum" and switch["placement"] == "switch"
