"""The KV tier's fidelity check (`pool_fetch`): every answered pool fetch against the pool link's fetch lane, one
FIFO (model/judge/fidelity.py: prescribed_fetches_s), built from stats dicts, no process."""

from __future__ import annotations

import pytest

from kvtransit.model.judge.fidelity import prescribed_fetches_s, prescribed_handoff_s
from kvtransit.model.judge.slo import RequestRecord
from kvtransit.model.scenario import Scenario
from kvtransit.report.build import build_report

SCENARIO = Scenario.build(codec="none", scale=0.0625, requests=4, kv_pool="pool", prefix_workload="system-prompts")
BW = SCENARIO.link_spec.bandwidth_Bps
LATENCY = SCENARIO.link_spec.latency_s


def test_a_fetch_on_an_idle_lane_is_a_hand_off_of_its_bytes():
    [alone] = prescribed_fetches_s(SCENARIO, [(5.0, 2e8, 2e8, 0.0)])
    assert alone == pytest.approx(prescribed_handoff_s(SCENARIO, 2e8, 2e8)) == pytest.approx(LATENCY + 2e8 / BW)


def test_fetches_asked_together_queue_on_the_lane_in_the_order_asked():
    one = 1e8 / BW  # a fetch's occupancy of the lane
    # Given out of order: the second-asked waits for the first, the third finds the lane free again.
    got = prescribed_fetches_s(SCENARIO, [(1.0 + 0.5 * one, 1e8, 1e8, 0.0), (1.0, 1e8, 1e8, 0.0),
                                          (10.0, 1e8, 1e8, 0.002)])
    assert got == pytest.approx([1.5 * one + LATENCY, one + LATENCY, one + LATENCY + 0.002])


def _report(fetches, lookups) -> dict:
    records = [RequestRecord(i, float(i), 2048, 2, [i + 0.1, i + 0.11], i + 0.1, first_token_stamp_s=i + 0.06)
               for i in range(4)]
    prefill = {"role": "prefill", "name": "prefill-0", "shortest_step_wall_s": 0.05, "timer_lateness_mean_s": 1e-6,
               "prefix": {"mode": "pool", "lookups": lookups, "fetches": fetches}}
    return build_report(SCENARIO, records, [prefill], run_wall_s=4.0, tokens_delivered=8)


def _fetches(factor: float) -> list[list[float]]:
    """Four fetches a second apart (the lane idle for each) that took `factor` × the model."""
    return [[float(i), 1e8, 1e8, factor * prescribed_handoff_s(SCENARIO, 1e8, 1e8), 0.0] for i in range(4)]


@pytest.mark.parametrize("factor,ok", [(1.01, True), (0.97, True), (1.3, False), (0.8, False)])
def test_fetches_off_the_lanes_model_either_way_fail_the_check(factor, ok):
    check = _report(_fetches(factor), {"hit": 4})["fidelity"]["pool_fetch"]
    assert check["ok"] is ok and check["measured"] == pytest.approx(factor - 1)
    if not ok:
        assert "pool fetches" in check["hint"] and "off the model" in check["hint"]


def test_lookups_without_an_answered_fetch_are_not_measured_and_requests_naming_no_blocks_are_not_judged():
    check = _report([], {"hit": 0, "miss": 0, "pool-down": 3, "fetch-failed": 1})["fidelity"]["pool_fetch"]
    assert check["ok"] is False and check["hint"] == "not measured: no pool fetch was answered"
    assert "pool_fetch" not in _report([], {})["fidelity"]  # no request looked up a prefix: nothing to judge
