"""Where a run's requests come from: the scenario's drawn workload, or a trace file replayed (model/serving/traces.py).

A trace is opened by workload/trace_file.py (the pool warms from the same one: --pool-warm trace).
`requests_for` is what the load generator replays; `workload_description` is what the report says about it (for a
trace: which file, how many of its requests from which one, the time scale, how many prompts the context cap cut).
"""

from __future__ import annotations

from kvtransit.model.judge.slo import RequestRecord
from kvtransit.model.scenario import Scenario
from kvtransit.model.serving.workload import RequestSpec, generate
from kvtransit.workload.trace_file import load_trace as load_trace


def requests_for(scenario: Scenario) -> list[RequestSpec]:
    """The requests the load generator sends, in arrival order: a trace's, a flow's own (a prefix workload), or the
    drawn workload; then as each enabled flow shapes them (the ring class's get their long prompt)."""
    if scenario.trace:
        return load_trace(scenario).requests
    sections = scenario.enabled_sections
    specs = next((own for s in sections if (own := s.requests(scenario)) is not None), None)
    if specs is None:
        specs = generate(scenario.workload)
    for section in sections:
        specs = section.shape_requests(scenario, specs)
    return specs


def workload_description(scenario: Scenario) -> dict:
    """The report's `workload` block: the source and, for a trace, what was applied to it."""
    if scenario.trace:
        return {"source": "trace", **load_trace(scenario).applied}
    for section in scenario.enabled_sections:
        described = section.workload(scenario)
        if described is not None:
            return described
    return {"source": "drawn", "arrival": scenario.arrival, "rate_rps": scenario.rate, "requests": scenario.requests}


def new_record(scenario: Scenario, spec: RequestSpec, arrival_s: float, **extra) -> RequestRecord:
    """A client's record of one request, judged by the scenario's SLO."""
    return RequestRecord(spec.request_id, arrival_s, spec.prompt_tokens, spec.output_tokens,
                         ttft_slo_s=scenario.ttft_slo_ms / 1e3, tpot_slo_s=scenario.tpot_slo_ms / 1e3, **extra)
