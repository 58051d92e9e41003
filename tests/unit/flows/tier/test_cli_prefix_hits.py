"""`kvtransit prefix-hits`: the hit rate a workload implies, per pool capacity, as the model computes it."""

from __future__ import annotations

import json

from kvtransit.cli import main
from kvtransit.flows.tier.prefix import implied_hit_rate
from kvtransit.flows.tier.section import TierSection
from kvtransit.flows.tier.workloads import prefix_requests
from kvtransit.model.scenario import Scenario
from kvtransit.model.serving.traces import BLOCK_TOKENS


def test_prefix_hits_prints_the_implied_rate_for_each_capacity(capsys):
    flags = ["--prefix-workload", "sessions", "--requests", "60", "--session-turns", "5", "--prompt-mean", "600"]
    block_bytes = Scenario().model_spec.kv_bytes(BLOCK_TOKENS)
    assert main(["prefix-hits", *flags, "--capacity", "1e15", "--capacity", str(4 * block_bytes), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    sessions = Scenario.build(prefix_workload="sessions", requests=60, session_turns=5, prompt_mean=600.0)
    requests = [(r.prompt_tokens, r.hash_ids) for r in prefix_requests(sessions, TierSection.of(sessions))]
    assert [row["hit_rate"] for row in rows] == [implied_hit_rate(requests, None).rate,
                                                 implied_hit_rate(requests, 4).rate]
    assert rows[1]["capacity_blocks"] == 4 and rows[1]["hit_rate"] < rows[0]["hit_rate"]


def test_a_workload_without_block_ids_implies_no_hits(capsys):
    assert main(["prefix-hits", "--requests", "10", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["hit_rate"] == 0.0
