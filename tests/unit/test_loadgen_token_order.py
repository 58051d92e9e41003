"""The load generator's tokens of one request arrive on two connections (the first from the prefill, the rest from
decode), so a later one can overtake an earlier one when a process wakes late: it is held and delivered, in
order, when the one before it arrives. A token that comes twice fails its request. No sockets: `_token` as the
readers call it."""

from __future__ import annotations

from kvtransit.agents.loadgen.agent import LoadGenerator
from kvtransit.agents.process import Address
from kvtransit.model.judge.slo import Outcome
from kvtransit.model.scenario import Scenario
from kvtransit.runtime.clock import ManualClock
from kvtransit.workload.source import new_record

ANY = Address("127.0.0.1", 0)
MS = 1_000_000


def _open_request(output_tokens: int) -> tuple[LoadGenerator, int]:
    scenario = Scenario(requests=1, output_mean=float(output_tokens), output_cv=0.0)
    loadgen = LoadGenerator(scenario, name="loadgen-test", prefills=[ANY], decodes=[], metrics_listen=ANY,
                            clock=ManualClock())
    spec = loadgen.workload[0]
    assert spec.output_tokens == output_tokens
    loadgen.records[spec.request_id] = new_record(scenario, spec, 0.0)
    loadgen._open.add(spec.request_id)  # as send_request leaves it
    return loadgen, spec.request_id


def test_a_token_that_overtakes_the_first_is_delivered_after_it_at_its_time():
    loadgen, rid = _open_request(3)
    loadgen._token(rid, 1, 40 * MS)  # decode's first step, before the prefill's first token
    record = loadgen.records[rid]
    assert record.token_times_s == [] and loadgen.tokens_overtaking == 1
    loadgen._token(rid, 0, 55 * MS)
    assert record.token_times_s == [0.055, 0.055]  # the user sees token 1 only with token 0
    loadgen._token(rid, 2, 80 * MS)
    assert record.token_times_s == [0.055, 0.055, 0.080]
    assert record.outcome in (Outcome.OK, Outcome.SLO_MISS) and rid not in loadgen._open
    assert loadgen.tokens_delivered == 3 and not loadgen._overtaking


def test_several_held_tokens_are_delivered_in_order_once_the_gap_fills():
    loadgen, rid = _open_request(4)
    for index, at in ((3, 30), (1, 10), (2, 20)):
        loadgen._token(rid, index, at * MS)
    loadgen._token(rid, 0, 50 * MS)
    assert loadgen.records[rid].token_times_s == [0.05] * 4 and rid not in loadgen._open


def test_a_token_that_comes_twice_fails_its_request():
    loadgen, rid = _open_request(3)
    loadgen._token(rid, 0, 10 * MS)
    loadgen._token(rid, 0, 11 * MS)
    record = loadgen.records[rid]
    assert record.outcome is Outcome.FAILED and record.failure == "token 0 arrived twice"
    loadgen2, rid2 = _open_request(3)
    loadgen2._token(rid2, 2, 10 * MS)
    loadgen2._token(rid2, 2, 11 * MS)  # held, then again
    assert loadgen2.records[rid2].failure == "token 2 arrived twice" and not loadgen2._overtaking
