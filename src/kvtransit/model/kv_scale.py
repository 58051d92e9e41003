"""KV at scale: the layout of one request's KV with fewer channels, and how scale and dilation are chosen.

Scale `s` shrinks each request's KV along the *channel* axis (kv_heads × head_dim), never the token axis, so the
codec's transform along tokens stays real (ARCHITECTURE.md, time and scale). Channels are whole numbers, so the
*effective* scale is channels / (kv_heads × head_dim) exactly. `scale="auto"` takes the most channels whose scaled link
rate stays within `HOST_BUDGET_BPS`; when even one channel is too fast, dilation grows until it fits.

Pure: no I/O, no clock. `Scenario` (scenario.py) is the one caller that matters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvtransit.model.catalog.links import Link
from kvtransit.model.catalog.models import ModelSpec
from kvtransit.model.errors import ConfigError

# What one host can push through the testbed's KV link, bytes per second of scaled link rate, and stay
# faithful with the band-keep kernel running (measured, benchmarks/fidelity.py, RESULTS.md "Fidelity", on
# this 2-core box with all four processes on it): codec none stays within 2 % of the analytic hand-off up to
# 195 MB/s; with freq-keep-k the bf16 kernel falls behind the link at 195 MB/s (1.85x its link time) and
# keeps up at 49 MB/s. 50 MB/s keeps the default scenario faithful.
HOST_BUDGET_BPS = 50e6
# Dilation steps when even one channel is too fast: round up to a tenth so the figure reads cleanly.
DILATION_QUANTUM = 0.1

@dataclass(frozen=True)
class KvLayout:
    """The shape of one request's KV cache at scale: per layer, [2 (K, V), kv_heads, tokens, head_dim]."""

    layers: int
    kv_heads: int
    head_dim: int
    bytes_per_value: int = 2  # BF16 on the wire (docs/reference.md §1)

    @property
    def channels(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.layers * self.channels * self.bytes_per_value

    def layer_shape(self, tokens: int) -> tuple[int, int, int, int]:
        return (2, self.kv_heads, tokens, self.head_dim)

    def layer_bytes(self, tokens: int) -> int:
        return 2 * self.channels * tokens * self.bytes_per_value

    def request_bytes(self, tokens: int) -> int:
        return tokens * self.bytes_per_token


def scaled_layout(model: ModelSpec, channels: int) -> KvLayout:
    """Lay `channels` out as heads × head_dim, keeping the model's KV head count whenever it divides them."""
    if not 1 <= channels <= model.kv_dim:
        raise ConfigError(f"KV channels at scale must be in 1..{model.kv_dim}, got {channels}")
    if channels % model.kv_heads == 0:
        return KvLayout(model.layers, model.kv_heads, channels // model.kv_heads, model.bytes_per_value)
    return KvLayout(model.layers, 1, channels, model.bytes_per_value)


def channels_for_scale(model: ModelSpec, scale: float) -> int:
    """The channel count closest to `scale × kv_dim` (at least one)."""
    return max(1, min(model.kv_dim, round(scale * model.kv_dim)))


def smallest_scale(model: ModelSpec) -> float:
    """One KV channel a layer: below it a layer would carry no bytes (no frame to send), so it is refused."""
    return 1 / model.kv_dim


def require_one_channel(model: ModelSpec, scale: float) -> None:
    smallest = smallest_scale(model)
    # A relative tolerance so that the smallest scale as printed (rounded up) is itself accepted.
    if scale * model.kv_dim < 1 - 1e-9:
        shown = round_up(smallest)
        raise ConfigError(f"scale: {scale!r} leaves {model.name} less than one KV channel a layer "
                          f"({scale * model.kv_dim:.3g} of {model.kv_dim}); the smallest allowed is {shown:g} "
                          f"(1/{model.kv_dim}: one channel)")


def round_up(value: float, digits: int = 3) -> float:
    """`value` rounded up to `digits` significant digits, so the figure a message prints is never below it."""
    step = 10.0 ** (math.floor(math.log10(value)) - digits + 1)
    return math.ceil(value / step - 1e-9) * step


def host_dilation(modelled_s: float, host_floor_s: float, scaled_rate_Bps: float,
                  budget_Bps: float = HOST_BUDGET_BPS) -> float:
    """The least dilation (≥ 1, up to a DILATION_QUANTUM) at which this host carries a live group: a modelled
    event (a hop, a step) of `modelled_s` at least `host_floor_s` (what one costs the host, measured), and the
    link's scaled rate within `budget_Bps`."""
    need = max(host_floor_s / modelled_s, scaled_rate_Bps / budget_Bps)
    return max(1.0, math.ceil(need / DILATION_QUANTUM - 1e-9) * DILATION_QUANTUM)


def serial_dilation(modelled_s: float, host_floor_s: float, share: float) -> float:
    """The least dilation (≥ 1, up to a DILATION_QUANTUM) at which a flow whose messages go one after another is
    held to its link model: the host's own cost of an event (`host_floor_s`, measured on an unshaped link) at most
    `share` of the event's modelled link time `modelled_s`.

    Unlike a group on absolute deadlines (host_dilation: there a host cost shorter than the event is absorbed), a
    serial flow sends each message when the previous one was handled, so the host's cost adds to every link time
    it measures; run at dilation D (the link at rate / D and latency × D, times divided by D) it adds 1/D of it."""
    if not (modelled_s > 0 and math.isfinite(modelled_s)):
        raise ConfigError(f"a serial flow's modelled link time must be > 0, got {modelled_s!r}")
    if not (0 < share <= 1):
        raise ConfigError(f"share must be in (0, 1], got {share!r}")
    need = max(0.0, host_floor_s) / (share * modelled_s)
    return max(1.0, round(math.ceil(need / DILATION_QUANTUM - 1e-9) * DILATION_QUANTUM, 6))


def resolve_dilation(asked: float | str, auto: float) -> tuple[float, str]:
    """(the dilation a live group runs at, why): "auto" takes `auto` (host_dilation's), a number itself."""
    if asked == "auto":
        return auto, "auto"
    dilation = float(asked)
    if not dilation >= 1:
        raise ConfigError(f"--dilation must be >= 1 or auto, got {dilation!r}")
    return dilation, f"asked for (auto would take {auto:g})"


def auto_channels_and_dilation(model: ModelSpec, link: Link, dilation: float, budget_Bps: float) -> tuple[int, float]:
    """The most channels whose scaled link rate fits `budget_Bps` at `dilation`; more dilation if one does not.

    Prefers a whole number of channels per KV head (the model's head structure kept) when that is possible.
    """
    per_channel_Bps = link.bandwidth_Bps / model.kv_dim / dilation
    most = min(model.kv_dim, math.floor(budget_Bps / per_channel_Bps))
    if most >= 1:
        if most >= model.kv_heads:
            most -= most % model.kv_heads
        return most, dilation
    needed = per_channel_Bps * dilation / budget_Bps
    return 1, math.ceil(needed / DILATION_QUANTUM - 1e-9) * DILATION_QUANTUM
