"""The run report fails closed: faithful only when every fidelity check ran and passed; and its energy adds up
from the agents' own counters (built from stats dicts, no process)."""

from __future__ import annotations

import pytest

from kvtransit.model.judge.fidelity import prescribed_handoff_s
from kvtransit.model.judge.slo import RequestRecord
from kvtransit.model.scenario import Scenario
from kvtransit.report.build import build_report
from kvtransit.report.text import headline

SCENARIO = Scenario(codec="none", scale=0.0625, requests=10)  # eth-25g shaped to 195 MB/s, dilation 1
PROMPT = 2048
KV = float(SCENARIO.model_spec.kv_bytes(PROMPT))  # model bytes of one hand-off
KV_SCALED = KV * SCENARIO.effective_scale  # what crossed the emulated link
N = 10


def _records(handoff_factor: float = 1.0) -> list[RequestRecord]:
    """N requests, one a second (the link idle for each), whose hand-off took `handoff_factor` × the model."""
    handoff_s = prescribed_handoff_s(SCENARIO, KV, KV) * handoff_factor
    records = []
    for i in range(N):
        first = i + 0.06
        records.append(RequestRecord(i, float(i), PROMPT, 5, [first + 0.2 + k * 0.01 for k in range(5)],
                                     first + handoff_s, first_token_stamp_s=first))
    return records


def _stats(**changes) -> dict[str, dict]:
    """Agents' /stats for a faithful run; `changes`: {role: {key: value}} to break one figure."""
    wire = KV_SCALED * N
    stats = {
        "prefill": {"role": "prefill", "name": "prefill-0", "gpu_energy_j": 5.0, "shortest_step_wall_s": 0.059,
                    "timer_lateness_mean_s": 5e-6},
        "decode": {"role": "decode", "name": "decode-0", "gpu_energy_j": 10.0, "shortest_step_wall_s": 0.0062,
                   "timer_lateness_mean_s": 5e-6,
                   "link": {"wire_bytes": wire, "raw_bytes": wire, "transfers": N,
                            "busy_s": wire / SCENARIO.scaled_link.bandwidth_Bps},
                   "accuracy": {"sampled_requests": 0, "k_relative_error": None, "v_relative_error": None}},
        "middlebox": {"role": "middlebox", "name": "middlebox", "wire_bytes": wire, "kernel_compute_s": 0.0,
                      "modelled_compute_s": 0.0, "module_energy_j": 0.0},
    }
    for role, fields in changes.items():
        stats[role] = {**stats[role], **fields}
    return stats


def _report(records=None, stats=None, *, without=(), missing_stats=()) -> dict:
    stats = _stats() if stats is None else stats
    peers = [s for role, s in stats.items() if role not in without]
    return build_report(SCENARIO, _records() if records is None else records, peers, run_wall_s=10.0,
                        tokens_delivered=5 * N, missing_stats=missing_stats)


def test_every_check_ran_and_passed_is_faithful():
    report = _report()
    assert report["faithful"], report["fidelity"]
    assert set(report["fidelity"]) == {"timer_prefill-0", "timer_decode-0", "link_rate", "kernel_time",
                                       "handoff_model"}
    assert report["errors"] == []


def test_a_report_built_without_the_decodes_stats_is_not_faithful_and_names_what_was_not_measured():
    report = _report(without=("decode",), missing_stats=["no stats from 127.0.0.1:9: connection refused"])
    assert report["faithful"] is False
    fidelity = report["fidelity"]
    for check in ("stats", "timer_decode", "link_rate", "handoff_model"):
        assert fidelity[check]["ok"] is False and fidelity[check]["hint"].startswith("not measured"), check
    assert "127.0.0.1:9" in fidelity["stats"]["hint"]
    assert report["errors"] == ["no stats from 127.0.0.1:9: connection refused"]
    assert any(line.startswith("ERROR: no stats from 127.0.0.1:9") for line in headline(report))


def test_a_report_without_the_middleboxs_stats_has_its_kernel_time_not_measured():
    report = _report(without=("middlebox",))
    assert report["faithful"] is False
    assert report["fidelity"]["kernel_time"]["hint"] == "not measured: no middlebox stats"
    assert report["energy_j"]["module"] is None  # nobody measured it: null, never the model's figure


@pytest.mark.parametrize("check, stats, handoff_factor", [
    ("timer_decode-0", _stats(decode={"timer_lateness_mean_s": 0.0062 * 0.1}), 1.0),  # 10 % of a step late
    ("timer_prefill-0", _stats(prefill={"timer_lateness_mean_s": 0.059 * 0.1}), 1.0),
    ("link_rate", _stats(decode={"link": {**_stats()["decode"]["link"],
                                          "busy_s": 2 * _stats()["decode"]["link"]["busy_s"]}}), 1.0),
    ("kernel_time", _stats(middlebox={"kernel_compute_s": 10.0}), 1.0),
    ("handoff_model", _stats(), 1.05),  # every hand-off 5 % over latency + bytes / bw
])
def test_each_fidelity_check_can_make_the_run_unfaithful(check, stats, handoff_factor):
    report = _report(_records(handoff_factor), stats)
    assert report["faithful"] is False
    failed = {name for name, gap in report["fidelity"].items() if not gap["ok"]}
    assert failed == {check}


def test_a_late_timer_that_ran_at_normal_priority_says_so_in_its_hint():
    why = "normal: no permission for SCHED_RR (root, CAP_SYS_NICE or RLIMIT_RTPRIO needed)"
    late = {"timer_lateness_mean_s": 0.0062 * 0.1}
    normal = _report(stats=_stats(decode={**late, "timer_priority": why}))["fidelity"]["timer_decode-0"]
    assert not normal["ok"] and normal["hint"].endswith(f"(its timers ran at {why})")
    realtime = _report(stats=_stats(decode={**late, "timer_priority": "realtime (SCHED_RR 10 ...)"}))
    assert "ran at" not in realtime["fidelity"]["timer_decode-0"]["hint"]


def test_the_handoff_distribution_is_in_the_fidelity_block():
    block = _report(_records(1.01))["fidelity"]["handoff_model"]
    assert block["ok"] and block["measured"] == pytest.approx(0.01)
    dist = block["distribution"]
    assert dist["idle_handoffs"] == dist["handoffs"] == N and dist["ratio"]["p50"] == pytest.approx(1.01)


def test_handoffs_queued_behind_another_are_left_out_of_the_model_check():
    records = _records()
    # Request 1 starts while request 0 is still on the link and takes twice the model: queueing, not the link.
    busy = records[0].kv_ready_s
    assert busy is not None
    queued = prescribed_handoff_s(SCENARIO, KV, KV) * 2
    records[1] = RequestRecord(1, busy - 0.07, PROMPT, 5, [busy - 0.01 + 0.2 + k * 0.01 for k in range(5)],
                               busy - 0.01 + queued, first_token_stamp_s=busy - 0.01)
    block = _report(records)["fidelity"]["handoff_model"]
    assert block["ok"] and block["distribution"]["idle_handoffs"] == N - 1


# --- energy -----------------------------------------------------------------------------------------------

def test_module_energy_is_the_middleboxs_own_counter():
    assert _report(stats=_stats(middlebox={"module_energy_j": 0.25}))["energy_j"]["module"] == 0.25
    # Under --policy host the kernel runs on the host: the middlebox counts nothing, and neither does the report,
    # though the scenario names a codec that would run in transit.
    assert _report()["energy_j"]["module"] == 0.0


def test_pool_fetches_and_write_backs_are_in_the_energy_when_the_pool_is_used():
    assert _report()["energy_j"]["pool"] is None
    relay = {"fetch_wire_bytes": 1e6, "put_wire_bytes": 3e6, "module_energy_j": 0.5}
    report = _report(stats=_stats(middlebox={"pool_relay": relay}))
    link_j = 4e6 / SCENARIO.effective_scale * 8 * SCENARIO.link_spec.pj_per_bit * 1e-12
    assert report["energy_j"]["pool"] == pytest.approx(link_j + 0.5)
    without = _report()
    assert report["j_per_token"] == pytest.approx(without["j_per_token"] + (link_j + 0.5) / (5 * N))
