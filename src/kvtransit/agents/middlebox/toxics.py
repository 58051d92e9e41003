"""toxiproxy's toxics in its own words, and what each one is on this middlebox (no I/O: toxiproxy_api.py serves it).

A toxic is {"name", "type", "stream", "toxicity", "attributes"} with toxiproxy's attribute names and units
(toxiproxy 2.12, toxics/*.go): latency and jitter in ms, bandwidth `rate` in KB/s (1 KB = 1000 B: the toxic
sleeps len/rate ms per chunk), timeouts in ms, the slicer's `delay` in µs, sizes in bytes. Each becomes one of
the middlebox's own faults (faults/) on the link to decode, or, for `latency`, extra delay on the link stage's
delay line: toxiproxy delays each chunk from its arrival, pipelined and in order, which is what the delay line
does (the `latency` fault instead holds each write, a slow peer).

Direction: toxiproxy's proxy forwards a client to an upstream server; here the client is the prefill and the
upstream is decode, so the KV bytes are toxiproxy's `upstream` stream. The other direction (decode's Acks back to
the prefill) is not faulted here: a `downstream` toxic is refused, saying so.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvtransit.agents.middlebox.faults.bandwidth import Bandwidth
from kvtransit.agents.middlebox.faults.base import Fault
from kvtransit.agents.middlebox.faults.limit_data import LimitData
from kvtransit.agents.middlebox.faults.reset_peer import ResetPeer
from kvtransit.agents.middlebox.faults.slicer import Slicer
from kvtransit.agents.middlebox.faults.timeout import Timeout
from kvtransit.model.errors import ConfigError
from kvtransit.runtime.clock import Clock

KV_STREAM = "upstream"  # prefill (toxiproxy's client) -> decode (its upstream): the KV bytes
STREAMS = ("upstream", "downstream")
DEFAULT_STREAM = "downstream"  # toxiproxy's default (toxic_collection.go AddToxicJson)
KB = 1000  # toxiproxy's bandwidth KB: bandwidth.go sleeps len(data) ms / rate


@dataclass(frozen=True)
class ToxicType:
    """A toxic type: its attributes with toxiproxy's defaults (Go zero values), and what it becomes here."""

    attributes: dict[str, int]
    # The fault this toxic is, from its attributes (None: the toxic is a no-op at these values, as toxiproxy's
    # bandwidth with rate 0); `latency` has none, it lives on the delay line.
    fault: Callable[[str, dict[str, float], Clock], Fault | None] | None = None


def _bandwidth(name: str, a: dict[str, float], clock: Clock) -> Fault | None:
    # bandwidth.go: a rate <= 0 lets everything through
    return Bandwidth(name, {"rate_Bps": a["rate"] * KB}, clock=clock) if a["rate"] > 0 else None


TOXIC_TYPES: dict[str, ToxicType] = {
    "latency": ToxicType({"latency": 0, "jitter": 0}),
    "bandwidth": ToxicType({"rate": 0}, _bandwidth),
    "timeout": ToxicType({"timeout": 0}, lambda name, a, clock: Timeout(name, {"timeout_s": a["timeout"] / 1e3},
                                                                         clock=clock)),
    "slicer": ToxicType({"average_size": 0, "size_variation": 0, "delay": 0},
                        lambda name, a, clock: Slicer(name, {"average_bytes": max(1.0, a["average_size"]),
                                                             "size_variation_bytes": a["size_variation"],
                                                             "delay_s": a["delay"] / 1e6}, clock=clock)),
    "limit_data": ToxicType({"bytes": 0}, lambda name, a, clock: LimitData(name, {"bytes": a["bytes"]}, clock=clock)),
    "reset_peer": ToxicType({"timeout": 0}, lambda name, a, clock: ResetPeer(name, {"after_s": a["timeout"] / 1e3},
                                                                             clock=clock)),
}
NOT_HERE = {"slow_close": "the middlebox keeps its links to decode open, so there is no close to delay"}


@dataclass
class Toxic:
    name: str
    type: str
    stream: str
    toxicity: float
    attributes: dict[str, float] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.type, "stream": self.stream, "toxicity": self.toxicity,
                "attributes": dict(self.attributes)}

    @property
    def delay_s(self) -> tuple[float, float]:
        """(latency, jitter) in seconds that a `latency` toxic adds to the delay line ((0, 0) for the others)."""
        if self.type != "latency":
            return 0.0, 0.0
        return self.attributes["latency"] / 1e3, self.attributes["jitter"] / 1e3

    def fault(self, fault_name: str, clock: Clock) -> Fault | None:
        """The middlebox fault this toxic is, waiting on `clock` (None: it is delay, or a no-op at these values)."""
        make = TOXIC_TYPES[self.type].fault
        return make(fault_name, self.attributes, clock) if make is not None else None


def _number(where: str, value: Any, low: float, high: float = math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not low <= value <= high:
        bound = f"[{low:g}, {high:g}]" if math.isfinite(high) else f">= {low:g}"
        raise ConfigError(f"{where}: expected a number {bound}, got {value!r}")
    return float(value)


def _attributes(toxic_type: str, given: Any, base: dict[str, float]) -> dict[str, float]:
    if not isinstance(given, dict):
        raise ConfigError(f"toxic attributes: expected a JSON object, got {type(given).__name__}")
    known = TOXIC_TYPES[toxic_type].attributes
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise ConfigError(f"{toxic_type} toxic: unknown attribute {unknown[0]!r} (attributes: {', '.join(known)})")
    merged = dict(base)
    for key, value in given.items():
        merged[key] = _number(f"{toxic_type} toxic attribute {key!r}", value, 0.0)
    return merged


def new_toxic(body: Any) -> Toxic:
    """A toxic from a `POST /proxies/{proxy}/toxics` body, as toxiproxy reads it (ConfigError: what was wrong)."""
    if not isinstance(body, dict):
        raise ConfigError(f"a toxic is a JSON object, got {type(body).__name__}")
    unknown = sorted(set(body) - {"name", "type", "stream", "toxicity", "attributes"})
    if unknown:
        raise ConfigError(f"unknown toxic field {unknown[0]!r} (fields: name, type, stream, toxicity, attributes)")
    toxic_type = body.get("type")
    if toxic_type in NOT_HERE:
        raise ConfigError(f"toxic type {toxic_type!r} is not modelled here: {NOT_HERE[toxic_type]}")
    if not isinstance(toxic_type, str) or toxic_type not in TOXIC_TYPES:
        raise ConfigError(f"invalid toxic type {toxic_type!r} (types: {', '.join(TOXIC_TYPES)})")
    stream = body.get("stream", DEFAULT_STREAM)
    if stream not in STREAMS:
        raise ConfigError(f"stream was invalid, can be either upstream or downstream (got {stream!r})")
    if stream != KV_STREAM:
        raise ConfigError(f"stream {stream!r}: this middlebox faults the KV bytes only, which flow from the prefill "
                          f"(toxiproxy's client) to decode (its upstream): use stream {KV_STREAM!r}")
    toxicity = _number("toxicity", body.get("toxicity", 1.0), 0.0, 1.0)
    if toxic_type == "latency" and toxicity != 1.0:
        raise ConfigError("a latency toxic here delays every byte of the link (its delay line): toxicity must be 1")
    name = body.get("name") or f"{toxic_type}_{stream}"  # toxiproxy's default name
    if not isinstance(name, str):
        raise ConfigError(f"toxic name: expected a string, got {name!r}")
    base = {key: float(value) for key, value in TOXIC_TYPES[toxic_type].attributes.items()}
    return Toxic(name, toxic_type, stream, toxicity, _attributes(toxic_type, body.get("attributes", {}), base))


def updated_toxic(toxic: Toxic, body: Any) -> Toxic:
    """`toxic` with a `POST|PATCH /proxies/{proxy}/toxics/{toxic}` body applied: attributes merge, toxicity
    replaces (toxic_collection.go UpdateToxicJson); the name, type and stream stay."""
    if not isinstance(body, dict):
        raise ConfigError(f"a toxic update is a JSON object, got {type(body).__name__}")
    unknown = sorted(set(body) - {"name", "type", "stream", "toxicity", "attributes"})
    if unknown:
        raise ConfigError(f"unknown toxic field {unknown[0]!r} (fields: toxicity, attributes)")
    toxicity = _number("toxicity", body.get("toxicity", toxic.toxicity), 0.0, 1.0)
    if toxic.type == "latency" and toxicity != 1.0:
        raise ConfigError("a latency toxic here delays every byte of the link (its delay line): toxicity must be 1")
    attributes = _attributes(toxic.type, body.get("attributes", {}), toxic.attributes)
    return Toxic(toxic.name, toxic.type, toxic.stream, toxicity, attributes)
