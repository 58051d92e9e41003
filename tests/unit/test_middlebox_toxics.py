"""toxiproxy's toxics read as toxiproxy reads them, and what each becomes on the middlebox (toxics.py)."""

from __future__ import annotations

import pytest

from kvtransit.agents.middlebox.faults.bandwidth import Bandwidth
from kvtransit.agents.middlebox.faults.limit_data import LimitData
from kvtransit.agents.middlebox.faults.reset_peer import ResetPeer
from kvtransit.agents.middlebox.faults.slicer import Slicer
from kvtransit.agents.middlebox.faults.timeout import Timeout
from kvtransit.agents.middlebox.faults.toxicity import PerConnection
from kvtransit.agents.middlebox.toxics import KV_STREAM, new_toxic, updated_toxic
from kvtransit.model.errors import ConfigError
from kvtransit.runtime.clock import ManualClock

CLOCK = ManualClock()


def toxic(type_: str, **attributes):
    return new_toxic({"type": type_, "stream": KV_STREAM, "attributes": attributes})


def test_a_toxic_gets_toxiproxys_defaults_for_name_toxicity_and_every_attribute():
    made = toxic("latency", latency=50)
    assert made.as_json() == {"name": "latency_upstream", "type": "latency", "stream": "upstream", "toxicity": 1.0,
                              "attributes": {"latency": 50.0, "jitter": 0.0}}


def test_latency_and_jitter_in_ms_become_delay_line_seconds_and_no_fault():
    made = toxic("latency", latency=50, jitter=5)
    assert made.delay_s == (0.05, 0.005)
    assert made.fault("f", CLOCK) is None


@pytest.mark.parametrize("type_, attributes, cls, expected", [
    ("bandwidth", {"rate": 250}, Bandwidth, {"rate_Bps": 250_000}),  # KB/s, 1 KB = 1000 B (bandwidth.go)
    ("timeout", {"timeout": 1500}, Timeout, {"timeout_s": 1.5}),
    ("slicer", {"average_size": 64, "size_variation": 8, "delay": 250}, Slicer,
     {"average_bytes": 64, "size_variation_bytes": 8, "delay_s": 250e-6}),  # the slicer's delay is in µs
    ("limit_data", {"bytes": 4096}, LimitData, {"bytes": 4096}),
    ("reset_peer", {"timeout": 200}, ResetPeer, {"after_s": 0.2, "after_bytes": 0}),
])
def test_each_toxic_becomes_the_fault_it_is_in_toxiproxys_units(type_, attributes, cls, expected):
    fault = toxic(type_, **attributes).fault("toxiproxy.kv.x", CLOCK)
    assert isinstance(fault, cls) and fault.clock is CLOCK
    assert {key: getattr(fault, key) for key in expected} == pytest.approx(expected)


def test_a_bandwidth_of_zero_lets_everything_through_as_in_toxiproxy():
    assert toxic("bandwidth", rate=0).fault("f", CLOCK) is None


def test_the_default_downstream_stream_is_refused_with_the_direction_the_kv_flows():
    with pytest.raises(ConfigError, match=r"stream 'downstream'.*prefill.*decode.*use stream 'upstream'"):
        new_toxic({"type": "latency", "attributes": {"latency": 5}})
    with pytest.raises(ConfigError, match="either upstream or downstream"):
        new_toxic({"type": "latency", "stream": "sideways"})


@pytest.mark.parametrize("body, message", [
    ({"type": "jam", "stream": "upstream"}, r"invalid toxic type 'jam' \(types: latency, bandwidth"),
    ({"type": "latency", "stream": "upstream", "attributes": {"latncy": 5}}, r"unknown attribute 'latncy'"),
    ({"type": "latency", "stream": "upstream", "attributes": {"latency": -1}}, r"'latency': expected a number >= 0"),
    ({"type": "latency", "stream": "upstream", "attributes": {"latency": True}}, r"'latency'"),
    ({"type": "bandwidth", "stream": "upstream", "toxicity": 1.5}, r"toxicity: expected a number \[0, 1\]"),
    ({"type": "latency", "stream": "upstream", "toxicity": 0.5}, r"toxicity must be 1"),
    ({"type": "slow_close", "stream": "upstream"}, r"'slow_close' is not modelled here"),
    ({"type": "latency", "stream": "upstream", "colour": "red"}, r"unknown toxic field 'colour'"),
    (["latency"], r"a toxic is a JSON object"),
])
def test_a_bad_toxic_is_refused_naming_what_was_wrong(body, message):
    with pytest.raises(ConfigError, match=message):
        new_toxic(body)


def test_an_update_merges_attributes_and_replaces_toxicity():
    made = new_toxic({"type": "bandwidth", "stream": "upstream", "name": "slow", "attributes": {"rate": 100}})
    changed = updated_toxic(made, {"toxicity": 0.25, "attributes": {"rate": 40}})
    assert (changed.name, changed.toxicity, changed.attributes) == ("slow", 0.25, {"rate": 40.0})
    with pytest.raises(ConfigError, match="unknown attribute 'latency'"):
        updated_toxic(made, {"attributes": {"latency": 1}})


async def test_toxicity_draws_once_per_connection_and_is_repeatable():
    class Conn:
        pass

    def draws(seed_name: str) -> list[bool]:
        fault = PerConnection(Bandwidth(seed_name, {"rate_Bps": 10.0}, clock=CLOCK), 0.5)
        conns = [Conn() for _ in range(64)]
        first = [fault.applies_to(c) for c in conns]
        assert [fault.applies_to(c) for c in conns] == first  # once drawn, a connection keeps its draw
        return first

    got = draws("toxiproxy.kv.coin")
    assert got == draws("toxiproxy.kv.coin")  # seeded by the name
    assert 16 < sum(got) < 48  # about half of 64 connections
    never = PerConnection(Bandwidth("n", {"rate_Bps": 10.0}, clock=CLOCK), 0.0)
    passed: list = []

    async def next_write(parts):
        passed.append(parts)

    await never.write([b"abc"], next_write, Conn())  # a connection the toxic missed: written at once
    assert passed == [[b"abc"]] and never.describe()["toxicity"] == 0.0
