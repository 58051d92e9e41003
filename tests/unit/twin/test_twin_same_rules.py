"""The twin decides by the very functions the agents call, never a second copy of a rule (issue constraint; the
table in docs/twin.md "What it runs"): each decision's function is the same object in the twin and in the agent
that makes the decision live."""

from __future__ import annotations

import importlib

import pytest

from kvtransit.twin import link as twin_link
from kvtransit.twin import serving as twin

# (the decision, the function's name, the agent module that calls it live)
DECISIONS = [
    ("which prefill instance", "PrefillRouter", "kvtransit.agents.loadgen.agent"),
    ("the requests, in order", "requests_for", "kvtransit.agents.loadgen.agent"),
    ("the prefill batch", "prefill_queue", "kvtransit.agents.prefill.agent"),
    ("the prefill step", "plan_prefill_step", "kvtransit.agents.prefill.agent"),
    ("a queued request's part of the step", "batch_entry", "kvtransit.agents.prefill.agent"),
    ("which decode instance", "least_loaded", "kvtransit.agents.middlebox.decode_peers"),
    ("take or refuse the KV", "KvArrivals", "kvtransit.agents.decode.agent"),
    ("decode admission", "DecodeBatcher", "kvtransit.agents.decode.agent"),
    ("the decode step", "plan_decode_step", "kvtransit.agents.decode.agent"),
]


@pytest.mark.parametrize("decision,name,agent_module", DECISIONS, ids=[d[0] for d in DECISIONS])
def test_the_twin_makes_each_decision_with_the_agents_own_function(decision, name, agent_module):
    assert getattr(twin, name) is getattr(importlib.import_module(agent_module), name), decision


def test_the_twins_link_holds_a_handoff_for_what_the_fidelity_guard_prescribes():
    from kvtransit.model.judge import fidelity

    assert twin_link.prescribed_serialise_s is fidelity.prescribed_serialise_s
    assert twin_link.prescribed_latency_s is fidelity.prescribed_latency_s
