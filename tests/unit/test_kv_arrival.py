"""Decode's decisions on an arriving hand-off (model/serving/kv_arrival.py): taken once, re-acked when retried, dropped
while stopping or with no client, refused when it can never fit."""

from __future__ import annotations

import pytest

from kvtransit.model.serving.kv_arrival import KvArrivals, Verdict
from kvtransit.model.serving.policies import DecodeBatcher, ServingRequest

BATCHER = DecodeBatcher(kv_capacity_tokens=10_000)


def arrive(arrivals: KvArrivals, request_id: int, *, prompt: int = 1000, output: int = 100, stopping: bool = False,
           has_clients: bool = True):
    began = arrivals.begin(request_id)
    return arrivals.end(ServingRequest(request_id, prompt, output), BATCHER, began_duplicate=began.duplicate,
                        stopping=stopping, has_clients=has_clients)


def test_a_first_arrival_that_fits_is_accepted_and_remembered():
    arrivals = KvArrivals(accuracy_sample=0)
    decision = arrive(arrivals, 1)
    assert (decision.verdict, decision.ack_ok) == (Verdict.ACCEPT, True)
    assert 1 in arrivals


def test_a_retried_hand_off_is_a_duplicate_answered_as_the_first_time():
    arrivals = KvArrivals(accuracy_sample=0)
    arrive(arrivals, 1)
    assert arrivals.begin(1).duplicate
    again = arrive(arrivals, 1)
    assert (again.verdict, again.ack_ok, again.reason) == (Verdict.DUPLICATE, True, "duplicate")
    arrive(arrivals, 2, prompt=20_000)  # refused: FAILED
    assert (arrive(arrivals, 2).verdict, arrive(arrivals, 2).ack_ok) == (Verdict.DUPLICATE, False)


def test_a_stream_taken_meanwhile_by_another_connection_is_a_duplicate_at_its_end():
    arrivals = KvArrivals(accuracy_sample=0)
    began = arrivals.begin(7)  # first stream begins...
    arrive(arrivals, 7)  # ...a retry on another connection completes first
    late = arrivals.end(ServingRequest(7, 1000, 100), BATCHER, began_duplicate=began.duplicate, stopping=False,
                        has_clients=True)
    assert late.verdict == Verdict.DUPLICATE


def test_while_stopping_nothing_is_taken_so_the_sender_keeps_the_kv():
    arrivals = KvArrivals(accuracy_sample=0)
    decision = arrive(arrivals, 1, stopping=True)
    assert (decision.verdict, decision.reason) == (Verdict.STOPPING, "decode is stopping")
    assert 1 not in arrivals  # it may come back and be taken


def test_with_no_load_generator_connected_the_hand_off_is_dropped_for_a_retry():
    arrivals = KvArrivals(accuracy_sample=0)
    assert arrive(arrivals, 1, has_clients=False).verdict == Verdict.NO_CLIENT
    assert 1 not in arrivals
    assert arrive(arrivals, 1).verdict == Verdict.ACCEPT


def test_stopping_is_decided_before_no_client_and_a_duplicate_before_both():
    arrivals = KvArrivals(accuracy_sample=0)
    assert arrive(arrivals, 1, stopping=True, has_clients=False).verdict == Verdict.STOPPING
    arrive(arrivals, 2)
    assert arrive(arrivals, 2, stopping=True, has_clients=False).verdict == Verdict.DUPLICATE


def test_a_request_that_can_never_fit_is_refused_with_its_sizes_and_remembered():
    arrivals = KvArrivals(accuracy_sample=0)
    decision = arrive(arrivals, 1, prompt=9_950, output=100)
    assert (decision.verdict, decision.ack_ok) == (Verdict.REFUSE, False)
    assert decision.reason == "needs 10050 KV tokens, more than decode holds (10000)"
    assert decision.client_reason == "kv does not fit decode"
    assert 1 in arrivals


def test_only_the_first_n_taken_streams_are_sampled_and_never_a_duplicate():
    arrivals = KvArrivals(accuracy_sample=2)
    arrive(arrivals, 1)
    assert arrivals.sampled == 1
    assert not arrivals.begin(1).sampled  # a retry of a sampled request is drained, not measured again
    assert arrivals.begin(2).sampled
    assert not arrivals.begin(3).sampled


def test_the_memory_of_taken_requests_is_bounded_and_forgets_the_oldest_first():
    arrivals = KvArrivals(accuracy_sample=0, known=3)
    for rid in range(5):
        arrive(arrivals, rid)
    assert len(arrivals) == 3
    assert 0 not in arrivals and 1 not in arrivals and 4 in arrivals


@pytest.mark.parametrize("sample, known", [(-1, 10), (0, 0)])
def test_bad_sizes_are_refused(sample, known):
    with pytest.raises(ValueError, match="must be >= "):
        KvArrivals(accuracy_sample=sample, known=known)
