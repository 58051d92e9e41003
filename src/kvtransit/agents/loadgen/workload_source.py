"""Where a run's requests come from: the scenario's drawn workload, or a trace file replayed (model/serving/traces.py).

A trace is opened by agents/common/trace_file.py (the pool warms from the same one: --pool-warm trace).
`requests_for` is what the load generator replays; `workload_description` is what the report says about it (for a
trace: which file, how many of its requests from which one, the time scale, how many prompts the context cap cut).
"""

from __future__ import annotations

from kvtransit.agents.common.trace_file import load_trace as load_trace
from kvtransit.flows.ring.ring_class import with_ring_prompts
from kvtransit.flows.tier.workloads import prefix_requests
from kvtransit.model.judge.slo import RequestRecord
from kvtransit.model.scenario import Scenario
from kvtransit.model.serving.workload import RequestSpec, generate


def requests_for(scenario: Scenario) -> list[RequestSpec]:
    """The requests the load generator sends, in arrival order (the ring class's with their long prompt:
    flows/ring/ring_class.py; a ring class takes neither a trace nor a prefix workload, Scenario says)."""
    if scenario.trace:
        return load_trace(scenario).requests
    if scenario.prefix_workload != "none":
        return prefix_requests(scenario)
    return with_ring_prompts(generate(scenario.workload), scenario.seed, scenario.ring_share, scenario.ring_prompt)


def workload_description(scenario: Scenario) -> dict:
    """The report's `workload` block: the source and, for a trace, what was applied to it."""
    if scenario.trace:
        return {"source": "trace", **load_trace(scenario).applied}
    if scenario.prefix_workload == "system-prompts":
        return {"source": "system-prompts", "system_prompts": scenario.system_prompts,
                "system_prompt_tokens": scenario.system_prompt_tokens, "rate_rps": scenario.rate,
                "requests": scenario.requests}
    if scenario.prefix_workload == "sessions":
        return {"source": "sessions", "session_turns": scenario.session_turns, "think_time_s": scenario.think_time,
                "rate_sessions_per_s": scenario.rate, "requests": scenario.requests}
    return {"source": "drawn", "arrival": scenario.arrival, "rate_rps": scenario.rate, "requests": scenario.requests}


def new_record(scenario: Scenario, spec: RequestSpec, arrival_s: float, **extra) -> RequestRecord:
    """A client's record of one request, judged by the scenario's SLO."""
    return RequestRecord(spec.request_id, arrival_s, spec.prompt_tokens, spec.output_tokens,
                         ttft_slo_s=scenario.ttft_slo_ms / 1e3, tpot_slo_s=scenario.tpot_slo_ms / 1e3, **extra)
