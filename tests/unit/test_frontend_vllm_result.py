"""A run report under `vllm bench serve`'s result keys (agents/frontend/vllm_result.py): every key vLLM writes,
the figures computed over the completed requests as vLLM computes them, and null for what the report lacks."""

from __future__ import annotations

import math
import statistics

import pytest

from kvtransit.agents.frontend.vllm_result import vllm_result

# The keys of a result file `vllm bench serve --save-result` 0.33.0 wrote (vllm/benchmarks/serve.py: main_async's
# result_json, benchmark's result less the detailed lists, process_one_metric).
VLLM_KEYS = {"date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts", "request_rate",
             "burstiness", "max_concurrency", "duration", "completed", "failed", "total_input_tokens",
             "total_output_tokens", "request_throughput", "request_goodput", "output_throughput",
             "total_token_throughput", "max_output_tokens_per_s", "max_concurrent_requests", "latencies",
             "queue_times", "rtfx",
             *(f"{stat}_{metric}_ms" for stat in ("mean", "median", "std", "p99")
               for metric in ("ttft", "tpot", "itl", "e2el"))}


def request(rid, arrival, ttft, e2e, outcome="ok", prompt=100, output=10):
    tpot = (e2e - ttft) / (output - 1) if outcome in ("ok", "slo-miss") else None
    return {"id": rid, "arrival_s": arrival, "prompt_tokens": prompt, "output_tokens": output, "ttft_s": ttft,
            "tpot_s": tpot, "e2e_s": e2e, "outcome": outcome, "failure": "x" if outcome == "failed" else None}


REPORT = {
    "config": {"model": "llama3-8b", "rate": 2.0, "burstiness": 1.0, "max_concurrency": 0},
    "per_request": [request(0, 0.0, 0.10, 1.0), request(1, 0.5, 0.20, 1.9, "slo-miss"),
                    request(2, 1.2, 0.30, 1.2), request(3, 1.5, None, None, "failed")],
    "itl_s": {"mean": 0.1, "p50": 0.09, "p90": 0.15, "p99": 0.2, "max": 0.3},
    "goodput_rps": 1.5,
    "run": {"model_s": 4.0},
    "workload": {"source": "drawn"},
}


def test_every_key_vllm_writes_is_there():
    assert set(vllm_result(REPORT, date="20260101-000000")) >= VLLM_KEYS


def test_counts_and_throughputs_are_over_the_completed_requests():
    result = vllm_result(REPORT, date="d")
    assert (result["num_prompts"], result["completed"], result["failed"]) == (4, 3, 1)
    assert (result["total_input_tokens"], result["total_output_tokens"]) == (300, 30)
    assert result["request_throughput"] == pytest.approx(3 / 4.0)
    assert result["total_token_throughput"] == pytest.approx(330 / 4.0)
    assert (result["model_id"], result["request_rate"], result["request_goodput"]) == ("llama3-8b", 2.0, 1.5)


def test_latency_figures_are_vllms_mean_median_population_std_and_percentile_in_ms():
    result = vllm_result(REPORT, date="d")
    ttfts_ms = [100.0, 200.0, 300.0]
    assert result["mean_ttft_ms"] == pytest.approx(200.0)
    assert result["median_ttft_ms"] == pytest.approx(200.0)
    assert result["std_ttft_ms"] == pytest.approx(statistics.pstdev(ttfts_ms))
    assert result["p99_ttft_ms"] == pytest.approx(100.0 + (300.0 - 100.0) * 0.99)  # linear, numpy's default
    assert result["mean_e2el_ms"] == pytest.approx((1000 + 1900 + 1200) / 3)
    assert result["mean_tpot_ms"] == pytest.approx(statistics.fmean([900 / 9, 1700 / 9, 900 / 9]))


def test_itl_comes_from_the_reports_distribution_and_its_std_is_not_invented():
    result = vllm_result(REPORT, date="d")
    assert (result["mean_itl_ms"], result["median_itl_ms"], result["p99_itl_ms"]) == pytest.approx((100, 90, 200))
    assert result["std_itl_ms"] is None and result["max_output_tokens_per_s"] is None


def test_latencies_are_each_requests_e2e_and_zero_for_one_that_failed_as_vllm_writes():
    assert vllm_result(REPORT, date="d")["latencies"] == [1.0, 1.9, 1.2, 0.0]


def test_max_concurrent_requests_counts_requests_active_in_one_second_buckets():
    # Buckets from t=0: request 0 spans 0..1, request 1 spans 0..2, request 2 spans 1..2: 3 in buckets 1 and 2.
    assert vllm_result(REPORT, date="d")["max_concurrent_requests"] == 3


def test_a_frontend_run_has_no_rate_of_its_own_and_names_its_tokenizer():
    report = {**REPORT, "workload": {"source": "openai-frontend", "tokenizer": "bytes/4"},
              "frontend": {"tokenizer": "bytes/4"}}
    result = vllm_result(report, date="d")
    assert result["request_rate"] is None and result["burstiness"] is None and result["tokenizer_id"] == "bytes/4"


def test_a_run_with_nothing_completed_has_null_figures_not_zeros():
    report = {**REPORT, "per_request": [request(0, 0.0, None, None, "failed")]}
    result = vllm_result(report, date="d")
    assert result["completed"] == 0 and result["mean_ttft_ms"] is None and result["max_concurrent_requests"] == 0
    assert not any(isinstance(v, float) and math.isnan(v) for v in result.values())
