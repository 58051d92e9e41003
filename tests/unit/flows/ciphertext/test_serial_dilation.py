"""How slow a serial flow runs (model/kv_scale.py: serial_dilation; flows/ciphertext/serial_dilation.py: plan): the
host's measured cost of an event held to a share of the event's modelled link time."""

from __future__ import annotations

import argparse

import pytest

from kvtransit.flows.ciphertext.serial_dilation import SERIAL_SHARE, dilation_arg, plan
from kvtransit.model.errors import ConfigError
from kvtransit.model.kv_scale import serial_dilation


def test_the_dilation_makes_the_host_floor_at_most_the_share_of_the_modelled_time():
    # 93 µs of host a handshake against 41 µs of link: 93 / (0.025 × 41) = 90.73 → 90.8 (rounded up to a tenth).
    d = serial_dilation(41e-6, 93e-6, 0.025)
    assert d == pytest.approx(90.8)
    assert 93e-6 / (d * 41e-6) <= 0.025


def test_a_host_faster_than_the_share_needs_no_dilation():
    assert serial_dilation(1e-3, 1e-6, 0.025) == 1.0
    assert serial_dilation(1e-3, 0.0, 0.025) == 1.0


@pytest.mark.parametrize("modelled, share", [(0.0, 0.025), (float("nan"), 0.025), (1e-3, 0.0), (1e-3, 1.5)])
def test_a_modelled_time_or_share_out_of_range_is_refused(modelled, share):
    with pytest.raises(ConfigError):
        serial_dilation(modelled, 1e-4, share)


async def test_auto_measures_the_floor_once_and_says_why():
    calls = []

    async def floor() -> float:
        calls.append(1)
        return 2e-4

    d = await plan("auto", lambda: 1e-3, floor)
    assert calls == [1]
    assert d.dilation == pytest.approx(serial_dilation(1e-3, 2e-4, SERIAL_SHARE))
    assert (d.host_floor_s, d.modelled_s) == (2e-4, 1e-3)
    assert d.why.startswith("auto: the host's 200 µs")


async def test_a_dilation_asked_for_is_taken_without_measuring():
    async def floor() -> float:
        raise AssertionError("measured")

    d = await plan(12.5, lambda: 1e-3, floor)
    assert (d.dilation, d.why, d.host_floor_s) == (12.5, "asked for", None)


def test_the_flag_takes_auto_or_a_number_of_at_least_one():
    assert dilation_arg("auto") == "auto"
    assert dilation_arg("2.5") == 2.5
    for bad in ("0.5", "fast"):
        with pytest.raises(argparse.ArgumentTypeError, match=repr(bad)):
            dilation_arg(bad)
