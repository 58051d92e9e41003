"""The serving policies of docs/reference.md §4: prefill batching and routing, continuous decode batching and
routing."""

from __future__ import annotations

import pytest

from kvtransit.model.errors import ConfigError
from kvtransit.model.serving.policies import (
    MAX_DECODE_BATCH,
    PREFILL_BATCH_TOKEN_LIMIT,
    DecodeBatcher,
    DecodeRouter,
    PrefillQueue,
    PrefillRouter,
    ServingRequest,
    least_loaded,
)


def req(rid, prompt, output=4):
    return ServingRequest(rid, prompt, output)


# ── prefill batcher ──


def test_prefill_batch_takes_head_then_more_while_within_8192_tokens():
    q = PrefillQueue()
    for rid, prompt in enumerate([3000, 3000, 2192, 1]):
        q.push(req(rid, prompt))
    assert [r.request_id for r in q.take_batch()] == [0, 1, 2]  # 3000 + 3000 + 2192 = 8192 exactly
    assert [r.request_id for r in q.take_batch()] == [3]
    assert q.take_batch() == []


def test_prefill_batch_stops_at_first_that_does_not_fit_without_skipping_ahead():
    q = PrefillQueue()
    for rid, prompt in enumerate([5000, 4000, 100]):
        q.push(req(rid, prompt))
    assert [r.request_id for r in q.take_batch()] == [0]  # 4000 would overflow; 100 behind it must wait
    assert [r.request_id for r in q.take_batch()] == [1, 2]


def test_prefill_oversized_head_runs_alone():
    q = PrefillQueue()
    q.push(req(0, 20000))
    q.push(req(1, 10))
    assert [r.request_id for r in q.take_batch()] == [0]
    assert q.queued_tokens == 10


def test_prefill_queued_tokens_track_push_and_take():
    q = PrefillQueue(token_limit=100)
    q.push(req(0, 60))
    q.push(req(1, 50))
    assert (len(q), q.queued_tokens) == (2, 110)
    q.take_batch()
    assert (len(q), q.queued_tokens) == (1, 50)


def test_prefill_token_limit_is_the_references():
    assert PREFILL_BATCH_TOKEN_LIMIT == 8192 and MAX_DECODE_BATCH == 256


# ── routers ──


def test_least_loaded_breaks_ties_to_lowest_index():
    assert least_loaded([3, 1, 1]) == 1
    with pytest.raises(ConfigError):
        least_loaded([])


def test_prefill_router_picks_fewest_queued_prompt_tokens_and_forgets_on_first_token():
    router = PrefillRouter(2)
    assert router.assign(req(0, 1000)) == 0
    assert router.assign(req(1, 300)) == 1
    assert router.assign(req(2, 300)) == 1  # 300 < 1000
    assert router.assign(req(3, 500)) == 1  # 600 < 1000
    assert router.queued_tokens == (1000, 1100)
    router.complete(0)
    assert router.queued_tokens == (0, 1100)
    assert router.assign(req(4, 1)) == 0


def test_prefill_router_refuses_a_request_routed_twice():
    router = PrefillRouter(1)
    router.assign(req(7, 10))
    with pytest.raises(ConfigError, match="routed twice"):
        router.assign(req(7, 10))


def test_decode_router_picks_smallest_queue_plus_running():
    router = DecodeRouter(3)
    assert [router.assign(rid) for rid in range(4)] == [0, 1, 2, 0]
    router.complete(1)
    assert router.assign(9) == 1
    assert router.loads == (2, 1, 1)


# ── decode continuous batcher ──


def test_decode_generates_output_minus_one_tokens_one_per_step():
    b = DecodeBatcher(kv_capacity_tokens=10_000)
    b.enqueue(req("a", 100, output=3))
    assert [r.request_id for r in b.admit()] == ["a"]
    first = b.step()
    assert first.tokens == (("a", 1),) and first.finished == ()
    second = b.step()
    assert second.tokens == (("a", 2),) and second.finished == ("a",)
    assert b.running == 0 and b.reserved_tokens == 0


def test_decode_context_is_prompt_plus_tokens_so_far():
    b = DecodeBatcher(kv_capacity_tokens=10_000)
    b.enqueue(req("a", 100, output=10))
    b.enqueue(req("b", 50, output=10))
    b.admit()
    assert b.context_tokens == 101 + 51  # each already holds its first token
    b.step()
    assert b.context_tokens == 102 + 52


def test_decode_admission_reserves_prompt_plus_output_and_stops_at_first_that_does_not_fit():
    b = DecodeBatcher(kv_capacity_tokens=1000)
    b.enqueue(req("a", 500, output=100))  # 600
    b.enqueue(req("b", 350, output=100))  # 450: does not fit beside a
    b.enqueue(req("c", 10, output=10))  # 20 would fit, but FIFO: it waits behind b
    assert [r.request_id for r in b.admit()] == ["a"]
    assert (b.reserved_tokens, b.waiting, b.load) == (600, 2, 3)
    for _ in range(99):
        b.step()
    assert b.running == 0 and b.reserved_tokens == 0
    assert [r.request_id for r in b.admit()] == ["b", "c"]


def test_decode_admission_respects_max_running():
    b = DecodeBatcher(kv_capacity_tokens=10**9, max_running=2)
    for rid in range(3):
        b.enqueue(req(rid, 10, output=5))
    assert len(b.admit()) == 2
    assert b.waiting == 1


def test_decode_single_token_request_finishes_on_admission_without_running():
    b = DecodeBatcher(kv_capacity_tokens=100)
    b.enqueue(req("one", 10, output=1))
    assert [r.request_id for r in b.admit()] == ["one"]
    assert b.running == 0 and b.reserved_tokens == 0


def test_decode_refuses_a_request_that_can_never_fit():
    b = DecodeBatcher(kv_capacity_tokens=100)
    assert not b.fits_ever(req("big", 90, output=20))
    with pytest.raises(ConfigError, match="more than the decode instance holds"):
        b.enqueue(req("big", 90, output=20))


def test_decode_batch_matches_a_hand_run_schedule():
    """Three requests, capacity for two at a time: who emits which token at which step."""
    b = DecodeBatcher(kv_capacity_tokens=30)
    b.enqueue(req("a", 10, output=3))  # 13
    b.enqueue(req("b", 10, output=2))  # 12
    b.enqueue(req("c", 10, output=2))  # 12: waits for room
    log = []
    for _ in range(4):
        b.admit()
        if b.running:
            log.append(b.step().tokens)
    assert log == [(("a", 1), ("b", 1)), (("a", 2), ("c", 1))]


def test_serving_request_rejects_empty_lengths():
    with pytest.raises(ConfigError, match="prompt_tokens"):
        ServingRequest(0, 0, 1)
    with pytest.raises(ConfigError, match="output_tokens"):
        ServingRequest(0, 1, 0)
