"""A run report's summary under `vllm bench serve`'s result keys (`kvtransit up --result-format vllm`), so
notebooks written for vLLM's result JSON read a kvtransit run. Pure: a report dict in, a dict out.

The keys are those `vllm bench serve --save-result` writes without `--save-detailed`, in vLLM 0.33.0 (PyPI;
vllm/benchmarks/serve.py: `main_async`'s result_json, `benchmark`'s result less the per-request lists it drops
unless detailed, and `process_one_metric` for ttft, tpot, itl and e2el, with `--metric-percentiles 50,90,99` and
`--percentile-metrics ttft,tpot,itl,e2el`); checked key for key against a result file vLLM 0.33.0 wrote for a
run against this front end. The figures are computed as vLLM computes them: over every request that completed
(vLLM's `success`: ok or slo-miss here), the mean, median, population standard deviation and linearly
interpolated percentiles (numpy's defaults), in milliseconds; TPOT per request is (latency − TTFT) / (output
tokens − 1), as the report's. All times are model time, as in the report.

What the report does not hold is null rather than invented: `std_itl_ms` (the report keeps ITL as a distribution,
not every gap: mean, median and percentiles come from its `itl_s`, which like all of its distributions leaves out
the first 10 % of arrivals), `max_output_tokens_per_s` (needs every token's time), each request's client queue
time (`queue_times`: the report's arrival is when the request was sent), and, for a front-end run,
`request_rate` and `burstiness` (the clients chose them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from kvtransit.model.judge.slo import percentile

# vLLM's `--metric-percentiles` default is "99"; the report carries p50, p90 and p99 of each figure.
PERCENTILES = (50, 90, 99)
COMPLETED = ("ok", "slo-miss")
BACKEND = "kvtransit"


def _stats(name: str, values_s: Sequence[float]) -> dict[str, float | None]:
    """mean/median/std/pN of `values_s` (seconds) in ms, as `process_one_metric` names them."""
    ms = [v * 1e3 for v in values_s]
    if not ms:  # vLLM reports 0 for a figure with no values (`np.mean(x or 0)`); null says it was not measured
        return {f"mean_{name}_ms": None, f"median_{name}_ms": None, f"std_{name}_ms": None,
                **{f"p{q}_{name}_ms": None for q in PERCENTILES}}
    mean = math.fsum(ms) / len(ms)
    return {f"mean_{name}_ms": mean, f"median_{name}_ms": percentile(ms, 50),
            f"std_{name}_ms": math.sqrt(math.fsum((v - mean) ** 2 for v in ms) / len(ms)),
            **{f"p{q}_{name}_ms": percentile(ms, q) for q in PERCENTILES}}


def _itl_stats(itl: dict[str, Any] | None) -> dict[str, float | None]:
    def ms(key: str) -> float | None:
        value = (itl or {}).get(key)
        return None if value is None else value * 1e3

    return {"mean_itl_ms": ms("mean"), "median_itl_ms": ms("p50"), "std_itl_ms": None,
            **{f"p{q}_itl_ms": ms(f"p{q}") for q in PERCENTILES}}


def _max_concurrent(done: Sequence[dict[str, Any]]) -> int:
    """vLLM's `max_concurrent_requests`: over one-second buckets from the first start, the most completed requests
    active in one bucket (each counts in every bucket from its start's to its end's, inclusive)."""
    if not done:
        return 0
    start = min(r["arrival_s"] for r in done)
    buckets: dict[int, int] = {}
    for r in done:
        for second in range(int(r["arrival_s"] - start), int(r["arrival_s"] + r["e2e_s"] - start) + 1):
            buckets[second] = buckets.get(second, 0) + 1
    return max(buckets.values())


def vllm_result(report: dict[str, Any], *, date: str, label: str | None = None) -> dict[str, Any]:
    """`report` (report/build.py's, as written) under vLLM's result keys. `date`: vLLM's "%Y%m%d-%H%M%S"."""
    config = report.get("config") or {}
    requests = report.get("per_request") or []
    done = [r for r in requests if r.get("outcome") in COMPLETED and r.get("ttft_s") is not None
            and r.get("e2e_s") is not None]
    done_ids = {r["id"] for r in done}
    duration = (report.get("run") or {}).get("model_s")
    total_input = sum(int(r["prompt_tokens"]) for r in done)
    total_output = sum(int(r["output_tokens"]) for r in done)
    frontend = (report.get("workload") or {}).get("source") == "openai-frontend"
    tokenizer = (report.get("frontend") or {}).get("tokenizer") or (report.get("workload") or {}).get("tokenizer")

    def per_s(count: float) -> float | None:
        return count / duration if duration else None

    goodput = report.get("goodput_rps")
    max_concurrency = config.get("max_concurrency") or None
    return {
        "date": date,
        "endpoint_type": BACKEND,
        "backend": BACKEND,
        "label": label,
        "model_id": config.get("model"),
        "tokenizer_id": tokenizer,
        "num_prompts": len(requests),
        "request_rate": None if frontend else config.get("rate"),
        "burstiness": None if frontend else config.get("burstiness"),
        "max_concurrency": max_concurrency,
        "duration": duration,
        "completed": len(done),
        "failed": len(requests) - len(done),
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": per_s(len(done)),
        "request_goodput": goodput,
        "output_throughput": per_s(total_output),
        "total_token_throughput": per_s(total_input + total_output),
        "max_output_tokens_per_s": None,
        "max_concurrent_requests": _max_concurrent(done),
        # Per request, in the report's order: end-to-end seconds (vLLM writes 0.0 for a failed one).
        "latencies": [r["e2e_s"] if r["id"] in done_ids else 0.0 for r in requests],
        "queue_times": [None for _ in requests],
        "rtfx": 0.0,  # vLLM's inverse real-time factor of audio input: 0.0 for text, as vLLM writes it
        **_stats("ttft", [r["ttft_s"] for r in done]),
        **_stats("tpot", [r["tpot_s"] for r in done if r.get("tpot_s") is not None]),
        **_itl_stats(report.get("itl_s")),
        **_stats("e2el", [r["e2e_s"] for r in done]),
    }
