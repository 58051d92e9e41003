"""Trace parsing and replay (model/serving/traces.py), the trace and SLO scenario fields, and `--goodput`."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from kvtransit.cli.scenario_flags import add_scenario_args, parse_goodput, scenario_from_args
from kvtransit.flows.tier.section import TierSection
from kvtransit.model.errors import ConfigError
from kvtransit.model.judge.slo import RequestRecord
from kvtransit.model.scenario import Scenario
from kvtransit.model.serving.traces import TraceError, TraceRecord, detect_format, parse_azure, parse_mooncake, replay
from kvtransit.workload.source import load_trace, requests_for, workload_description

TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"


def _lines(name: str) -> list[str]:
    return (TRACES / name).read_text().splitlines(keepends=True)


def test_mooncake_excerpt_parses_with_arrivals_from_the_first_request():
    records = parse_mooncake(_lines("mooncake_excerpt.jsonl"), "excerpt")
    assert [(r.arrival_s, r.input_tokens, r.output_tokens) for r in records] == [
        (0.0, 6758, 500), (0.0, 7322, 490), (0.0, 7236, 794), (0.0, 2290, 316), (3.0, 13544, 71), (3.0, 87169, 402)]
    assert records[0].hash_ids[:3] == (0, 1, 2)


def test_azure_excerpt_parses_fractional_timestamps():
    records = parse_azure(_lines("azure_excerpt.csv"), "excerpt")
    assert [(r.input_tokens, r.output_tokens) for r in records][:2] == [(374, 44), (396, 109)]
    assert records[1].arrival_s == pytest.approx(50.9951690 - 46.6805900, abs=1e-6)
    assert records[-1].arrival_s == pytest.approx(56.0022750 - 46.6805900, abs=1e-6)


def test_malformed_mooncake_line_is_named_with_file_and_line_number():
    with pytest.raises(TraceError, match=r"bad\.jsonl, line 3: not a JSON object"):
        parse_mooncake(_lines("mooncake_malformed.jsonl"), "bad.jsonl")


def test_malformed_azure_line_is_named_with_file_and_line_number():
    expected = r"bad\.csv, line 4: ContextTokens must be a whole number >= 1, got 'eight hundred'"
    with pytest.raises(TraceError, match=expected):
        parse_azure(_lines("azure_malformed.csv"), "bad.csv")


@pytest.mark.parametrize("line,message", [
    ('{"timestamp": 0, "input_length": 10}', "missing output_length"),
    ('{"timestamp": -1, "input_length": 10, "output_length": 2}', "timestamp must be a number of ms >= 0"),
    ('{"timestamp": 0, "input_length": 0, "output_length": 2}', "input_length must be a whole number >= 1"),
    ('{"timestamp": 0, "input_length": 1.5, "output_length": 2}', "input_length must be a whole number"),
    ('[1, 2]', "expected a JSON object, got list"),
    ('{"timestamp": 0, "input_length": 3, "output_length": 2, "hash_ids": "x"}', "hash_ids must be a list"),
])
def test_bad_mooncake_fields_are_named(line, message):
    good = '{"timestamp": 0, "input_length": 10, "output_length": 2}\n'
    with pytest.raises(TraceError, match=f"t.jsonl, line 2: {message}"):
        parse_mooncake([good, line], "t.jsonl")


def test_azure_header_without_the_columns_is_rejected():
    with pytest.raises(TraceError, match="line 1: header lacks GeneratedTokens"):
        parse_azure(["TIMESTAMP,ContextTokens\n", "1,2\n"], "a.csv")


def test_a_trace_out_of_time_order_is_rejected():
    with pytest.raises(TraceError, match="request 2 arrives before request 1"):
        parse_mooncake(['{"timestamp": 5, "input_length": 1, "output_length": 1}\n',
                        '{"timestamp": 1, "input_length": 1, "output_length": 1}\n'], "t")


def test_an_empty_trace_is_rejected():
    with pytest.raises(TraceError, match="no requests"):
        parse_mooncake(["\n"], "t")


def test_format_is_detected_by_extension_or_asked_for():
    assert detect_format("x/trace.jsonl") == "mooncake" and detect_format("a.CSV") == "azure"
    with pytest.raises(TraceError, match="--trace-format"):
        detect_format("trace.txt")


RECORDS = [TraceRecord(t, p, o) for t, p, o in [(0.0, 100, 5), (1.0, 50_000, 6), (3.0, 300, 7), (7.0, 400, 8)]]


def test_replay_takes_the_first_n_scales_time_and_caps_prompts():
    out = replay(RECORDS, requests=3, time_scale=0.5, context_cap=1000, source="t")
    assert [(r.request_id, r.arrival_s, r.prompt_tokens, r.output_tokens) for r in out.requests] == [
        (0, 0.0, 100, 5), (1, 0.5, 1000, 6), (2, 1.5, 300, 7)]
    assert out.applied["prompts_capped"] == 1 and out.applied["sampling"] == "first 3 of 4"
    assert out.applied["replay_span_s"] == 1.5 and out.applied["trace_span_s"] == 3.0


def test_random_sampling_keeps_trace_order_and_is_seeded():
    a = replay(RECORDS, requests=2, sampling="random", seed=7)
    b = replay(RECORDS, requests=2, sampling="random", seed=7)
    assert a.requests == b.requests
    assert a.requests[0].arrival_s == 0.0 and a.requests[1].arrival_s > 0


def test_a_window_from_trace_start_keeps_the_requests_before_it_as_its_past_capped_alike():
    records = [TraceRecord(float(t), 600 * (t + 1), 5, tuple(range(t * 10, t * 10 + 3))) for t in range(4)]
    out = replay(records, requests=2, start=1, context_cap=1000, source="t")
    assert [(r.request_id, r.arrival_s, r.prompt_tokens) for r in out.requests] == [(0, 0.0, 1000), (1, 1.0, 1000)]
    assert out.requests[0].hash_ids == (10, 11)  # cut to the blocks the capped prompt covers
    assert out.earlier == [((0, 1), 600)]  # the first request, capped as the window's would be
    assert out.applied["start"] == 1 and out.applied["sampling"] == "first 2 of 4 from request 1"
    random_window = replay(records, requests=2, start=2, sampling="random", seed=3)
    assert [r.prompt_tokens for r in random_window.requests] == [1800, 2400]
    with pytest.raises(ConfigError, match=r"trace_start: request 4 is outside t's 4 requests \(give 0..3\)"):
        replay(records, requests=1, start=4, source="t")


def test_replay_rejects_bad_adjustments():
    with pytest.raises(ConfigError, match="time_scale"):
        replay(RECORDS, requests=2, time_scale=0)
    with pytest.raises(ConfigError, match="trace_sample"):
        replay(RECORDS, requests=2, sampling="every-other")


def test_scenario_trace_replaces_the_drawn_workload_and_the_report_says_what_was_applied():
    scenario = Scenario(trace=str(TRACES / "mooncake_excerpt.jsonl"), requests=6, time_scale=0.1, context_cap=8192)
    requests = requests_for(scenario)
    assert [r.prompt_tokens for r in requests] == [6758, 7322, 7236, 2290, 8192, 8192]
    assert requests[-1].arrival_s == pytest.approx(0.3)
    described = workload_description(scenario)
    assert described["source"] == "trace" and described["prompts_capped"] == 2 and described["time_scale"] == 0.1


def test_trace_start_and_pool_warm_name_what_they_need():
    trace = str(TRACES / "mooncake_excerpt.jsonl")
    with pytest.raises(ConfigError, match=r"trace_start: 2 needs a trace to start in \(--trace FILE\)"):
        Scenario(trace_start=2)
    with pytest.raises(ConfigError, match=r"pool_warm: 'trace' .* give --kv-pool pool and --trace FILE \(got kv_pool "
                                          r"'local', trace"):
        Scenario.build(trace=trace, kv_pool="local", pool_warm="trace")
    with pytest.raises(ConfigError, match="pool_warm: unknown value 'hot'"):
        Scenario.build(pool_warm="hot")
    with pytest.raises(ConfigError, match="trace_start"):
        Scenario(trace=trace, trace_start=-1)
    warm = Scenario.build(trace=trace, kv_pool="pool", pool_warm="trace", trace_start=4)
    assert TierSection.of(warm).pool_warm == "trace"


def test_a_missing_trace_file_is_a_clear_error():
    with pytest.raises(TraceError, match=r"cannot read .*nope\.jsonl"):
        load_trace(Scenario(trace="/nonexistent/nope.jsonl"))


def test_scenario_rejects_unknown_trace_format_and_bad_slo():
    with pytest.raises(ConfigError, match="trace_format: unknown value 'parquet'"):
        Scenario(trace_format="parquet")
    with pytest.raises(ConfigError, match="tpot_slo_ms"):
        Scenario(tpot_slo_ms=0)


def test_goodput_flag_sets_the_slo_thresholds():
    parser = argparse.ArgumentParser()
    add_scenario_args(parser)
    scenario = scenario_from_args(parser.parse_args(["--goodput", "ttft:500", "tpot:40"]))
    assert (scenario.ttft_slo_ms, scenario.tpot_slo_ms) == (500.0, 40.0)
    assert "--ttft-slo-ms" in scenario.to_argv()  # every process of the run judges by the same SLO


@pytest.mark.parametrize("item", ["e2el:100", "ttft", "tpot:fast"])
def test_goodput_flag_rejects_what_it_cannot_judge(item):
    with pytest.raises(ConfigError, match="--goodput"):
        parse_goodput([item])


def test_a_record_is_judged_by_its_own_slo():
    record = RequestRecord(0, 0.0, 10, 3, token_times_s=[0.5, 0.53, 0.56], ttft_slo_s=1.0, tpot_slo_s=0.025)
    assert not record.slo_met  # TPOT 30 ms > 25 ms
    record.tpot_slo_s = 0.040
    assert record.slo_met
