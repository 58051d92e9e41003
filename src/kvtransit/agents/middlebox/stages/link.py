"""Link stage: the shared FIFO hand-off link (docs/reference.md §4), shaped in user space.

A thin face on runtime.egress.EgressShaper: `channels` concurrent hand-offs in FIFO order, each paced by
a token bucket at the scaled link rate and released one link latency later. Chunks are not processed here:
a stream is delivered onto the shaper (pipeline.KvStream.deliver). Rate and latency change live (the control
API's `PUT /link`). The module's added latency rides on the delay line, since it is latency, not occupancy.

With `--link-backend tc` the kernel's qdisc on our egress shapes the rate, and this stage keeps only the delay
line, the module's hold, and a hold for the bytes tbf lets through at once (`TbfMirror`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from kvtransit.agents.middlebox.stages.base import Stage
from kvtransit.model.catalog.links import Link
from kvtransit.model.errors import ConfigError
from kvtransit.runtime.egress import DEFAULT_SLICE_BYTES, EgressShaper
from kvtransit.shaping.commands import burst_bytes as tc_burst_bytes
from kvtransit.shaping.commands import wire_rate_Bps as tc_wire_rate_Bps
from kvtransit.shaping.spec import SHAPED_MTU  # the shaped veth's MTU: its header overhead enters the hold

if TYPE_CHECKING:
    from kvtransit.agents.middlebox.stages.chain import ChainSettings

LINK_BACKENDS = ("userspace", "tc")
# With the link's rate shaped by the kernel (tc on the egress veth), the user-space token bucket stays in
# the chain only to hold a transit-bound module's extra time: it runs this many times faster than the link,
# so it never binds on the bytes themselves (TCP back-pressure from tc's queue paces the writes).
TC_BYPASS_FACTOR = 8.0
LINK_FIELDS = ("rate_Bps", "latency_s", "jitter_s")


def tc_burst_hold_ns(goodput_Bps: float) -> int:
    """How long tc's tbf lets a full bucket through at once, in ns, for a link shaped to `goodput_Bps`.

    tbf starts each hand-off after an idle gap with a full bucket (shaping.commands.burst_bytes, at the wire
    rate that carries `goodput_Bps` of TCP payload over SHAPED_MTU frames): holding a hand-off back by the
    burst's own time makes it end when latency + bytes / rate says."""
    wire_Bps = tc_wire_rate_Bps(goodput_Bps, SHAPED_MTU)
    return round(tc_burst_bytes(wire_Bps) / wire_Bps * 1e9)


class TbfMirror:
    """tc's tbf on our egress, mirrored from the bytes we hand it, in payload bytes: how much it would let through
    at once now, so a frame is held back by exactly that.

    tbf's bucket fills at the link's rate up to its burst and every byte takes a token; bytes without one wait in
    its queue (tokens below zero here: the queue's bytes). A frame of `nbytes` that finds `tokens` ready passes
    min(nbytes, tokens) at once and the rest at the rate, so held by min(nbytes, tokens) / rate it ends when
    latency + bytes / rate says. A whole hand-off after an idle gap finds a full bucket (the burst's time, as
    before this mirror); a layer-wise hand-off's layer, smaller than the burst (100-180 KB against 130 KB at the
    study's scale), held by the full burst arrived (burst − bytes) / rate late, and one behind a busy link found no
    tokens but was held all the same (idle-link exposed hand-offs ~1.03x the model at 8 req/s)."""

    def __init__(self, goodput_Bps: float):
        if not goodput_Bps > 0:
            raise ConfigError(f"the tbf mirror needs a rate > 0, got {goodput_Bps!r}")
        self.rate_Bps = goodput_Bps
        self.burst_bytes = tc_burst_hold_ns(goodput_Bps) / 1e9 * goodput_Bps  # the burst in payload bytes
        self._tokens = self.burst_bytes
        self._at_ns: int | None = None

    def _tokens_at(self, t_ns: int) -> float:
        if self._at_ns is None or t_ns <= self._at_ns:
            return self._tokens
        return min(self.burst_bytes, self._tokens + (t_ns - self._at_ns) / 1e9 * self.rate_Bps)

    def at_once_bytes(self, ready_ns: int) -> float:
        """How many bytes tbf would let through at once at `ready_ns` (0 behind a queue)."""
        return max(0.0, self._tokens_at(ready_ns))

    def hold_ns(self, ready_ns: int, nbytes: int) -> int:
        """How long to hold a frame of `nbytes` ready at `ready_ns`: the time of the part tbf lets through at once."""
        return round(min(nbytes, self.at_once_bytes(ready_ns)) / self.rate_Bps * 1e9)

    def sent(self, at_ns: int, nbytes: int) -> None:
        """`nbytes` reached tbf at `at_ns` (times only move forward: an earlier stamp counts as the latest)."""
        at_ns = max(at_ns, self._at_ns or at_ns)
        self._tokens = self._tokens_at(at_ns) - nbytes
        self._at_ns = at_ns


class LinkStage(Stage):
    name = "link"

    def __init__(self, link: Link, shaper: EgressShaper, *, module_latency_s: float, model_link: Link,
                 dilation: float, backend: str = "userspace"):
        """`backend`: one of LINK_BACKENDS (ChainSettings checks it, before any stage is built)."""
        self.link = link  # what is shaped (scaled rate, dilated latency)
        self.model_link = model_link  # what is modelled (docs/reference.md §2), for energy and reports
        self.shaper = shaper
        self.module_latency_s = module_latency_s
        # The delay line carries three delays: the link's, the module's, and a fault's (a toxiproxy latency
        # toxic, toxiproxy_api.py); each is kept apart so that reading or setting one leaves the others.
        self.link_jitter_s = 0.0
        self.fault_latency_s = 0.0
        self.fault_jitter_s = 0.0
        self.dilation = dilation
        self.backend = backend
        # tc's bucket, to hold each hand-off (or layer) by what it lets through at once; nothing to mirror when our
        # own bucket shapes.
        self.tbf = TbfMirror(link.bandwidth_Bps) if backend == "tc" else None

    @classmethod
    def from_settings(cls, settings: ChainSettings) -> LinkStage:
        shaped = settings.shaped_link
        tc = settings.link_backend == "tc"
        # Under tc, our bucket only paces ahead of tc's (TC_BYPASS_FACTOR) and hands it the first slice at once
        # (EgressShaper's burst_bytes): metering that slice out at 8x the rate left tbf's full bucket idle for
        # its time, up to 0.67 ms of link lost at each hand-off's start (a 256 KiB slice on a 48.8 MB/s link).
        shaper = EgressShaper(rate_Bps=shaped.bandwidth_Bps * (TC_BYPASS_FACTOR if tc else 1.0),
                              latency_s=shaped.latency_s + settings.module_latency_s, channels=settings.channels,
                              clock=settings.clock, burst_bytes=DEFAULT_SLICE_BYTES if tc else 0,
                              on_transfer_done=settings.on_transfer_done)
        return cls(shaped, shaper, module_latency_s=settings.module_latency_s, model_link=settings.model_link,
                   dilation=settings.dilation, backend=settings.link_backend)

    def burst_hold_ns(self, ready_ns: int, nbytes: int) -> int:
        """How long a frame (or a whole hand-off) of `nbytes`, ready at `ready_ns`, is held so that tbf's burst ends
        it on time (TbfMirror); 0 when our own bucket shapes."""
        return self.tbf.hold_ns(ready_ns, nbytes) if self.tbf is not None else 0

    def burst_at_once_bytes(self, ready_ns: int) -> float:
        """How many bytes tbf would let through at once at `ready_ns`; 0 when our own bucket shapes (it paces every
        byte: nothing passes at once)."""
        return self.tbf.at_once_bytes(ready_ns) if self.tbf is not None else 0.0

    def on_wire(self, at_ns: int, nbytes: int) -> None:
        """`nbytes` left for the link at `at_ns`: tbf's mirror takes their tokens."""
        if self.tbf is not None:
            self.tbf.sent(at_ns, nbytes)

    def stamp(self, nbytes: int, ready_ns: int, *, occupy_bytes: int | None = None) -> int:
        """When a frame of another flow (remote KV's legs) of `nbytes`, ready at `ready_ns`, is due at the far end of
        this link: its time on our bucket (`occupy_bytes`' when the module holds the link longer, docs/reference.md §5)
        and the delay line's latency. Under tc the bytes themselves queue in tbf behind the hand-offs' (a frame that
        comes late is counted late by its receiver): the mirror takes their tokens and the stamp is the link's own
        latency + bytes / rate from `ready_ns`."""
        held = nbytes if occupy_bytes is None else max(nbytes, occupy_bytes)
        if self.tbf is None:
            return self.shaper.stamp(held, ready_ns)
        self.tbf.sent(ready_ns, nbytes)
        return ready_ns + round((self.shaper.latency_s + held / self.shaped_rate_Bps) * 1e9)

    def describe(self) -> dict:
        return {"stage": self.name, "link": self.model_link.name, "rate_Bps": self.shaper.rate_Bps,
                "latency_s": self.latency_s, "module_latency_s": self.module_latency_s,
                "fault_latency_s": self.fault_latency_s,
                "channels": self.shaper.channels, "queued": self.shaper.queued, "active": self.shaper.active}

    @property
    def latency_s(self) -> float:
        """The link's own latency, shaped (the delay line also carries the module's and a fault's)."""
        return self.shaper.latency_s - self.module_latency_s - self.fault_latency_s

    @property
    def shaped_rate_Bps(self) -> float:
        """The rate the link is shaped to (by our bucket, or by tc)."""
        rate = self.shaper.rate_Bps
        return rate / TC_BYPASS_FACTOR if self.backend == "tc" else rate

    def reconfigure(self, update: dict) -> None:
        """`PUT /link`: any subset of rate_Bps, latency_s, jitter_s (shaped figures)."""
        unknown = sorted(set(update) - set(LINK_FIELDS))
        if unknown:
            raise ConfigError(f"unknown link field {unknown[0]!r} (fields: {', '.join(LINK_FIELDS)})")
        rate_Bps, latency_s, jitter_s = (update.get(name) for name in LINK_FIELDS)
        if rate_Bps is not None:
            if self.backend == "tc":
                raise ConfigError("the link's rate is shaped by tc here (--link-backend tc): change it with "
                                  "shaping/ (kvtransit links), not through the middlebox")
            self.set_rate(rate_Bps)
        if latency_s is not None or jitter_s is not None:
            self.set_latency(self.latency_s if latency_s is None else latency_s, jitter_s)

    def set_rate(self, rate_Bps: float) -> None:
        self.shaper.set_rate(rate_Bps)

    def set_latency(self, latency_s: float, jitter_s: float | None = None) -> None:
        if jitter_s is not None:
            self.link_jitter_s = jitter_s
        self._retune(latency_s)

    def set_fault_delay(self, latency_s: float, jitter_s: float) -> None:
        """A fault's delay on top of the link's (0, 0 removes it): every byte later by latency ± jitter, in
        order and pipelined, as toxiproxy's latency toxic delays each chunk from its arrival."""
        link_latency_s = self.latency_s
        self.fault_latency_s, self.fault_jitter_s = latency_s, jitter_s
        self._retune(link_latency_s)

    def _retune(self, link_latency_s: float) -> None:
        # Independent jitters add in variance (the delay line draws one deviation per slice).
        jitter_s = math.hypot(self.link_jitter_s, self.fault_jitter_s)
        self.shaper.set_latency(link_latency_s + self.module_latency_s + self.fault_latency_s, jitter_s)

    def energy_j(self, wire_bytes: int, model_bytes_per_byte: float) -> float:
        """Link energy = wire bits × link pJ/bit, for the modelled bytes (docs/reference.md §5)."""
        return self.model_link.energy_j(wire_bytes * model_bytes_per_byte)
