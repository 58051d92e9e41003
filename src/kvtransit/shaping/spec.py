"""What a shaped link should do, as one frozen value checked on construction.

Field names follow Chaos Mesh's NetworkChaos (`bandwidth.rate/limit`, `delay.latency/jitter/correlation`,
`loss.loss/correlation`, `direction: to|from|both`) and netem(8) (`distribution`, `loss gemodel p r 1-h 1-k`),
with the unit in each name so nobody has to guess bits from bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from kvtransit.shaping.errors import ShapingError
from kvtransit.shaping.units import parse_rate, parse_size, parse_time

DISTRIBUTIONS = ("normal", "uniform", "pareto", "paretonormal")  # netem(8) delay distributions (+ uniform: none)
DIRECTIONS = ("to", "from", "both")  # Chaos Mesh NetworkChaos.direction: to = egress of the link's source side

# veth default MTU and the smallest IPv4 MTU (RFC 791: 68 octets).
DEFAULT_MTU = 1500
MIN_MTU, MAX_MTU = 68, 65535
# The testbed's MTUs (harness/up/placement.py builds the veths). The unshaped veths to the root namespace are
# wiring, standing in for loopback (MTU 65536 there): with a 1500-byte MTU, TCP's initial window (10 segments)
# is 15 KB, and each hand-off on the prefill → middlebox hop restarted slow start after the idle gap between
# requests (the root namespace's sysctl is not ours to change). Measured here (10 light requests): hand-off
# median 1.34x the model with 1500 everywhere, 1.16x with placement's no-slow-start-after-idle sysctl alone.
WIRING_MTU = 65535
# The shaped link: jumbo frames, as data-centre fabrics carrying KV run them (RoCE 4096, Ethernet 9000).
SHAPED_MTU = 9000
# Longest latency we accept: far beyond any link in docs/reference.md §2; a typo guard (a "5s" meant as "5ms").
MAX_LATENCY_S = 10.0


def _check_number(name: str, value: object, *, low: float = 0.0, high: float = math.inf,
                  low_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ShapingError(name, value, "must be a finite number")
    if value < low or (low_open and value == low) or value > high:
        lo = f"> {low:g}" if low_open else f">= {low:g}"
        hi = f" and <= {high:g}" if math.isfinite(high) else ""
        raise ShapingError(name, value, f"must be {lo}{hi}")
    return float(value)


@dataclass(frozen=True)
class GilbertElliott:
    """netem `loss gemodel p r 1-h 1-k`, all in percent: a two-state (good/bad) burst-loss chain.

    p: P(good -> bad); r: P(bad -> good); loss_bad_pct (1-h): loss in the bad state; loss_good_pct (1-k): in good.
    """

    p_pct: float
    r_pct: float = 100.0
    loss_bad_pct: float = 100.0
    loss_good_pct: float = 0.0

    def __post_init__(self) -> None:
        for name in ("p_pct", "r_pct", "loss_bad_pct", "loss_good_pct"):
            _check_number(f"gilbert_elliott.{name}", getattr(self, name), high=100.0)

    def mean_loss_pct(self) -> float:
        """Stationary loss: pi_bad = p / (p + r), mixed with each state's loss."""
        if self.p_pct + self.r_pct == 0:
            return self.loss_good_pct
        bad = self.p_pct / (self.p_pct + self.r_pct)
        return bad * self.loss_bad_pct + (1 - bad) * self.loss_good_pct


@dataclass(frozen=True)
class LinkSpec:
    """One direction's (or both directions') shaping. `rate_Bps=None` leaves the rate unshaped.

    rate_Bps is the TCP *goodput* the link should deliver (bytes of payload per second); the tc commands add
    the header overhead themselves (commands.wire_rate_Bps).
    """

    rate_Bps: float | None = None
    latency_s: float = 0.0
    jitter_s: float = 0.0
    correlation_pct: float = 0.0
    distribution: str = "normal"
    loss_pct: float = 0.0
    loss_correlation_pct: float = 0.0
    gilbert_elliott: GilbertElliott | None = None
    limit_bytes: int | None = None  # queue limit; None sizes it from the bandwidth-delay product
    mtu: int = DEFAULT_MTU
    direction: str = "to"
    name: str = field(default="", compare=False)  # a preset's name, for reports only

    def __post_init__(self) -> None:
        if self.rate_Bps is not None:
            _check_number("rate_Bps", self.rate_Bps, low_open=True)
        _check_number("latency_s", self.latency_s, high=MAX_LATENCY_S)
        _check_number("jitter_s", self.jitter_s, high=MAX_LATENCY_S)
        _check_number("correlation_pct", self.correlation_pct, high=100.0)
        _check_number("loss_pct", self.loss_pct, high=100.0)
        _check_number("loss_correlation_pct", self.loss_correlation_pct, high=100.0)
        if self.distribution not in DISTRIBUTIONS:
            raise ShapingError("distribution", self.distribution, f"choose one of {', '.join(DISTRIBUTIONS)}")
        if self.direction not in DIRECTIONS:
            raise ShapingError("direction", self.direction, f"choose one of {', '.join(DIRECTIONS)}")
        if self.jitter_s and not self.latency_s:
            raise ShapingError("jitter_s", self.jitter_s, "jitter needs a latency to vary around (netem's rule too)")
        if self.gilbert_elliott is not None and self.loss_pct:
            raise ShapingError("loss_pct", self.loss_pct, "give random loss or gilbert_elliott, not both")
        if isinstance(self.mtu, bool) or not isinstance(self.mtu, int) or not MIN_MTU <= self.mtu <= MAX_MTU:
            raise ShapingError("mtu", self.mtu, f"must be an integer in [{MIN_MTU}, {MAX_MTU}]")
        limit = self.limit_bytes
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < self.mtu):
            raise ShapingError("limit_bytes", limit, f"must be an integer >= the MTU ({self.mtu})")

    # -- construction helpers -------------------------------------------------------------------------

    @classmethod
    def parse(
        cls,
        rate: str | None = None,
        latency: str | None = None,
        jitter: str | None = None,
        loss_pct: float = 0.0,
        limit: str | None = None,
        **rest: Any,
    ) -> LinkSpec:
        """From tc-style strings: LinkSpec.parse(rate="200mbit", latency="5ms", jitter="1ms", limit="1mb")."""
        return cls(
            rate_Bps=parse_rate(rate, "rate") if rate is not None else None,
            latency_s=parse_time(latency, "latency") if latency is not None else 0.0,
            jitter_s=parse_time(jitter, "jitter") if jitter is not None else 0.0,
            loss_pct=loss_pct,
            limit_bytes=parse_size(limit, "limit") if limit is not None else None,
            **rest,
        )

    def scaled(self, scale: float) -> LinkSpec:
        """The same link with its rate multiplied by the payload scale s (ARCHITECTURE.md, time and scale; 0 < s <= 1
        there, any positive factor here so time dilation 1/d composes). Latency is not scaled: transfer times stay
        equal."""
        _check_number("scale", scale, low_open=True)
        if self.rate_Bps is None:
            return self
        return replace(self, rate_Bps=self.rate_Bps * scale)

    def with_changes(self, **changes: Any) -> LinkSpec:
        """A copy with some fields changed, validated again (for run-time `tc qdisc change`)."""
        return replace(self, **changes)

    # -- what it asks for -----------------------------------------------------------------------------

    @property
    def has_delay(self) -> bool:
        return self.latency_s > 0 or self.jitter_s > 0

    @property
    def has_loss(self) -> bool:
        return self.loss_pct > 0 or self.gilbert_elliott is not None

    def describe(self) -> dict[str, Any]:
        """JSON-ready summary (manifests and reports)."""
        out: dict[str, Any] = {
            "rate_Bps": self.rate_Bps,
            "latency_s": self.latency_s,
            "jitter_s": self.jitter_s,
            "correlation_pct": self.correlation_pct,
            "distribution": self.distribution,
            "loss_pct": self.loss_pct,
            "loss_correlation_pct": self.loss_correlation_pct,
            "gilbert_elliott": None,
            "limit_bytes": self.limit_bytes,
            "mtu": self.mtu,
            "direction": self.direction,
            "name": self.name,
        }
        if self.gilbert_elliott is not None:
            ge = self.gilbert_elliott
            out["gilbert_elliott"] = {"p_pct": ge.p_pct, "r_pct": ge.r_pct, "loss_bad_pct": ge.loss_bad_pct,
                                      "loss_good_pct": ge.loss_good_pct}
        return out

    @classmethod
    def from_description(cls, data: dict[str, Any]) -> LinkSpec:
        data = dict(data)
        ge = data.pop("gilbert_elliott", None)
        return cls(gilbert_elliott=GilbertElliott(**ge) if ge else None, **data)
