"""Withdrawing a request whose client went away, in the pure serving policies (model/serving/policies.py): out of a
prefill queue (whole prompts or chunked) before its step, out of the decode batch with its KV reservation freed."""

from __future__ import annotations

from kvtransit.model.serving.policies import DecodeBatcher, PrefillQueue, ServingRequest
from kvtransit.model.serving.prefill_plan import ChunkedPrefillQueue


def test_a_cancelled_queued_prompt_leaves_the_queue_with_its_tokens_and_the_rest_keep_their_order():
    queue = PrefillQueue(token_limit=10_000)
    for rid, prompt in [(1, 1000), (2, 2000), (3, 3000)]:
        queue.push(ServingRequest(rid, prompt, 8))
    assert queue.cancel(2)
    assert (len(queue), queue.queued_tokens) == (2, 4000)
    assert [r.request_id for r in queue.take_batch()] == [1, 3]
    assert queue.queued_tokens == 0


def test_cancelling_a_prompt_not_queued_changes_nothing():
    queue = PrefillQueue()
    queue.push(ServingRequest(1, 1000, 8))
    queue.take_batch()  # in its step now: a step runs whole
    queue.push(ServingRequest(2, 500, 8))
    assert not queue.cancel(1) and not queue.cancel(99)
    assert (len(queue), queue.queued_tokens) == (1, 500)
    assert queue.cancel(2) and not queue.cancel(2)  # once only


def test_a_chunked_prompt_cancelled_between_its_chunks_gives_back_only_the_tokens_still_to_compute():
    queue = ChunkedPrefillQueue(chunk_tokens=512, token_limit=1024)
    queue.push(ServingRequest(1, 1500, 8))
    queue.push(ServingRequest(2, 300, 8))
    first = queue.take_batch()  # 512 of request 1, 300 of request 2 (done)
    assert [(c.request.request_id, c.tokens) for c in first] == [(1, 512), (2, 300)]
    assert queue.queued_tokens == 1500 - 512
    assert queue.cancel(1)
    assert (len(queue), queue.queued_tokens) == (0, 0)
    assert queue.take_batch() == []


def test_a_cancelled_running_sequence_frees_its_reservation_and_gets_no_more_tokens():
    batcher = DecodeBatcher(kv_capacity_tokens=1000)
    batcher.enqueue(ServingRequest("a", 100, 50))
    batcher.enqueue(ServingRequest("b", 200, 50))
    batcher.admit()
    batcher.step()
    assert batcher.reserved_tokens == 400
    assert batcher.cancel("a")
    assert (batcher.running, batcher.reserved_tokens, batcher.running_ids) == (1, 250, ("b",))
    assert [rid for rid, _ in batcher.step().tokens] == ["b"]
    assert not batcher.cancel("a")


def test_a_cancelled_waiting_request_is_never_admitted_and_frees_the_way_for_the_one_behind():
    batcher = DecodeBatcher(kv_capacity_tokens=1000)
    batcher.enqueue(ServingRequest("big", 600, 100))
    batcher.admit()
    batcher.enqueue(ServingRequest("blocked", 500, 100))  # does not fit beside "big": waits
    batcher.enqueue(ServingRequest("small", 100, 10))
    assert batcher.admit() == [] and batcher.waiting == 2
    assert batcher.cancel("big")  # running: its 700 tokens are free again
    assert batcher.cancel("blocked")  # waiting: gone from the queue
    assert [r.request_id for r in batcher.admit()] == ["small"]
    assert (batcher.waiting, batcher.running, batcher.reserved_tokens) == (0, 1, 110)


def test_cancelling_a_request_the_batch_does_not_hold_changes_nothing():
    batcher = DecodeBatcher(kv_capacity_tokens=1000)
    batcher.enqueue(ServingRequest("a", 100, 2))
    batcher.admit()
    assert batcher.step().finished == ("a",)
    assert not batcher.cancel("a") and not batcher.cancel("never")
    assert (batcher.waiting, batcher.running, batcher.reserved_tokens) == (0, 0, 0)
