"""Decode's per-request queue waits: what decode records and what the load generator reads back."""

from __future__ import annotations

import pytest

from kvtransit.agents.common.queue_waits import QueueWaits, parse_queue_waits, queue_waits_body


def test_a_wait_runs_from_kv_ready_to_admission_in_the_callers_units():
    waits = QueueWaits()
    waits.ready(7, 1_000_000_000)
    assert waits.admitted(7, 1_030_000_000, lambda wall_s: wall_s / 3) == pytest.approx(0.01)  # dilation 3
    assert waits.admitted(8, 1_030_000_000, float) is None  # never ready here (taken by a decode before a restart)
    assert waits.waits_s == {7: pytest.approx(0.01)}


def test_the_routes_json_reads_back_as_request_ids_and_seconds():
    assert parse_queue_waits(queue_waits_body({3: 0.25, 10: 0.0})) == {3: 0.25, 10: 0.0}
    for bad in ({}, {"queue_wait_s": [1, 2]}, None):
        with pytest.raises(ValueError, match="not a decode queue-waits answer"):
            parse_queue_waits(bad)


def test_the_routes_hand_off_splits_read_back_by_request_id():
    from kvtransit.agents.common.queue_waits import handoff_splits_body, parse_handoff_splits

    split = {"exposed_s": 0.03, "hidden_s": 0.01, "hidden_bytes": 512, "bytes": 2048}
    assert parse_handoff_splits(handoff_splits_body({4: split})) == {4: {k: float(v) for k, v in split.items()}}
    assert parse_handoff_splits({"queue_wait_s": {}}) == {}  # a decode that split nothing
    for bad in ({"handoff_split": [1]}, {"handoff_split": {"x": {}}}, None):
        with pytest.raises(ValueError, match="not a decode hand-off split answer"):
            parse_handoff_splits(bad)
