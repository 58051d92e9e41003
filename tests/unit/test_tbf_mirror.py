"""The middlebox's mirror of tc's tbf (stages/link.py: TbfMirror): a frame is held by exactly the part tbf lets
through at once, so under tc it still ends when latency + bytes / rate says."""

from __future__ import annotations

import pytest

from kvtransit.agents.middlebox.stages.link import TbfMirror, tc_burst_hold_ns
from kvtransit.model.errors import ConfigError

RATE = 36.6e6  # payload B/s: eth-25g at scale 0.0234, dilation 2 (the layer-wise study's link)
T = 10**12
MS = 1_000_000


def test_after_an_idle_gap_a_hand_off_bigger_than_the_burst_is_held_for_the_whole_burst():
    tbf = TbfMirror(RATE)
    assert tbf.hold_ns(T, 10**8) == pytest.approx(tc_burst_hold_ns(RATE), abs=1)


def test_a_frame_smaller_than_the_burst_is_held_only_for_its_own_bytes():
    tbf = TbfMirror(RATE)
    small = int(tbf.burst_bytes / 2)
    assert tbf.hold_ns(T, small) == round(small / RATE * 1e9)


def test_bytes_still_queued_in_tbf_leave_nothing_to_pass_at_once_and_the_bucket_refills_at_the_rate():
    tbf = TbfMirror(RATE)
    tbf.sent(T, int(tbf.burst_bytes) + 100_000)  # the burst and 100 kB more: 100 kB wait in tbf's queue
    assert tbf.hold_ns(T, 50_000) == 0
    drained_ns = round(100_000 / RATE * 1e9)
    assert tbf.hold_ns(T + drained_ns, 50_000) == pytest.approx(0, abs=50)  # the queue just emptied: no tokens
    later = T + drained_ns + 1 * MS  # 1 ms of tokens since
    assert tbf.hold_ns(later, 10**8) == pytest.approx(1 * MS, abs=50)
    assert tbf.hold_ns(T + 10**9, 10**8) == pytest.approx(tc_burst_hold_ns(RATE), abs=1)  # never past the burst


def test_a_stamp_earlier_than_the_last_counts_as_the_last():
    tbf = TbfMirror(RATE)
    tbf.sent(T + 5 * MS, int(tbf.burst_bytes))
    tbf.sent(T, 10_000)  # ready earlier, put on the link after the first: it waits behind it
    assert tbf.hold_ns(T + 5 * MS, 1) == 0


def test_a_mirror_without_a_rate_is_refused():
    with pytest.raises(ConfigError, match="rate > 0"):
        TbfMirror(0.0)
