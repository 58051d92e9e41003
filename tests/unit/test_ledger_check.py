"""The request-ledger checker (model/judge/ledger_check.py): each kind of violation is found, a clean history is
clean."""

import json

import pytest

from kvtransit.model.errors import ConfigError
from kvtransit.model.judge.ledger_check import check, first_after, parse, reason_class


def sent(rid, output=3):
    return {"ev": "sent", "id": rid, "output": output, "prefill": 0}


def tokens(*entries, src="decode-0"):
    return {"ev": "tokens", "src": src, "entries": [list(e) for e in entries]}


def outcome(rid, what="ok", reason=None, t=None):
    return {"ev": "outcome", "id": rid, "outcome": what, "reason": reason, "t": t}


def clean_history():
    return [sent(1), sent(2),
            tokens((1, 0), src="prefill-0"), {"ev": "kv_ready", "id": 1, "src": "decode-0", "t": 1.0},
            tokens((1, 1)), tokens((1, 2)), outcome(1),
            tokens((2, 0), src="prefill-0"), outcome(2, "failed", "decode 127.0.0.1:5 connection lost"),
            {"ev": "peer", "role": "decode", "name": "decode-0", "kv_content_mismatches": 0},
            {"ev": "counters", "requests": {"ok": 1, "slo-miss": 0, "failed": 1, "timed-out": 0}}]


def test_a_clean_history_has_no_violations_and_counts_outcomes_by_reason():
    verdict = check(clean_history())
    assert verdict.ok, verdict.problems()
    summary = verdict.summary()
    assert (summary["requests"], summary["ok"], summary["failed_total"]) == (2, 1, 1)
    assert summary["failed"] == {"decode ADDR connection lost": 1}


def test_a_sent_request_without_an_outcome_is_lost():
    verdict = check([sent(1), sent(2), outcome(1)])
    assert verdict.lost == [2] and not verdict.ok


def test_two_outcomes_for_one_request_are_a_duplicate():
    assert check([sent(1), outcome(1), outcome(1, "failed", "x")]).duplicated == [1]


def test_a_token_index_delivered_twice_is_a_duplicate_stream():
    assert check([sent(1), tokens((1, 1)), tokens((1, 1)), outcome(1)]).duplicated == [1]


def test_kv_admitted_twice_is_a_duplicate_stream():
    kv = {"ev": "kv_ready", "id": 1, "src": "decode-0"}
    assert check([sent(1), kv, kv, outcome(1)]).duplicated == [1]


@pytest.mark.parametrize("history,why", [
    ([sent(1), tokens((9, 1)), outcome(1)], "never sent"),
    ([sent(1, output=3), tokens((1, 3)), outcome(1)], "beyond the output length"),
    ([sent(1), outcome(1), tokens((1, 2))], "after the request finished"),
    ([sent(1), outcome(1), outcome(7, "failed", "x")], "never sent"),
])
def test_tokens_or_outcomes_that_belong_to_no_open_request_are_cross_delivered(history, why):
    verdict = check(history)
    assert verdict.cross_delivered and why in verdict.cross_delivered[0][2]


def test_tokens_after_a_failure_are_late_not_a_violation():
    verdict = check([sent(1), outcome(1, "failed", "gave up"), tokens((1, 1))])
    assert verdict.late_tokens == 1 and verdict.ok


def test_corrupted_kv_reported_by_decode_is_counted():
    verdict = check([sent(1), outcome(1), {"ev": "peer", "role": "decode", "kv_content_mismatches": 2}])
    assert verdict.corrupted == 2 and not verdict.ok


def test_a_failure_without_a_reason_is_a_violation():
    assert check([sent(1), outcome(1, "failed", "  ")]).failed_without_reason == [1]


def test_the_ledger_must_reconcile_with_the_prometheus_counter():
    history = clean_history()
    history[-1] = {"ev": "counters", "requests": {"ok": 2, "slo-miss": 0, "failed": 1, "timed-out": 0}}
    verdict = check(history)
    assert verdict.counter_mismatches == {"ok": (1, 2)} and not verdict.ok


def test_parse_tolerates_only_a_torn_last_line():
    lines = [json.dumps(r) + "\n" for r in clean_history()]
    assert len(parse([*lines, '{"ev": "sen'])) == len(lines)
    with pytest.raises(ConfigError, match="line 2 is not JSON"):
        parse([lines[0], "{oops\n", lines[1]])
    with pytest.raises(ConfigError, match="line 1: expected an object"):
        parse(['{"ev": "launch"}\n'])


def test_first_after_finds_when_the_path_worked_again():
    records = [{"ev": "kv_ready", "id": i, "t": t} for i, t in enumerate((1.0, 2.5, 4.0))]
    assert first_after(records, "kv_ready", 2.0) == 2.5
    assert first_after(records, "kv_ready", 5.0) is None


def test_reason_classes_blank_addresses_and_numbers():
    blanked = "hand-off gave up after N s and N attempt(s)"
    assert reason_class("hand-off gave up after 12 s and 3 attempt(s): no Ack") == blanked
    assert reason_class("") == "(no reason)"
