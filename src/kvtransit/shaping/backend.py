"""Which back-end realises each property of a spec: probe the kernel's qdiscs, then plan (or refuse).

The probe tries each qdisc on a veth inside a throw-away namespace it creates and deletes by name, so the
host's own interfaces are never touched. The plan says, per property, who does it: tc (tbf / htb / netem), the
user-space shaper (userspace.py: TokenBucket for rate, DelayLine for delay and jitter), or nobody, in which
case it raises before anything is created.
"""

from __future__ import annotations

import os
import secrets
import shutil
from dataclasses import dataclass, field
from typing import Any

from kvtransit.shaping import commands
from kvtransit.shaping.errors import CommandFailed, ShapingError
from kvtransit.shaping.runner import Runner, run_command
from kvtransit.shaping.spec import LinkSpec

# The qdiscs the shaper can use, each with the smallest valid options to try it with.
PROBED_QDISCS: dict[str, list[str]] = {
    "tbf": ["tbf", "rate", "1mbit", "burst", "32kb", "limit", "64kb"],
    "htb": ["htb", "default", "1"],
    "netem": ["netem", "delay", "1ms"],
    "bfifo": ["bfifo", "limit", "64kb"],
}
RATE_QDISCS = ("tbf", "htb")  # in order of preference: tbf is one qdisc with an exact byte bucket
# The user-space delay line's floor: asyncio sleeps through epoll_wait, whose timeout has 1 ms granularity
# (selectors.EpollSelector rounds up to the millisecond), so a release can be up to 1 ms late. Below this the
# delay would be mostly timer error, so such a latency is refused rather than silently faked.
USERSPACE_MIN_LATENCY_S = 0.001
RUN_ID_PREFIX = "kvt"


def new_run_id() -> str:
    """A short unique prefix for everything one run creates: `kvt<6 hex>-` (fits IFNAMSIZ with room)."""
    return f"{RUN_ID_PREFIX}{secrets.token_hex(3)}-"


@dataclass(frozen=True)
class Capabilities:
    """What this host can do: root, tc present, and each probed qdisc's availability."""

    root: bool
    tc: bool
    qdiscs: dict[str, bool] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    @property
    def kernel_shaping(self) -> bool:
        return self.root and self.tc and any(self.qdiscs.get(q) for q in RATE_QDISCS)

    @property
    def rate_qdisc(self) -> str | None:
        return next((q for q in RATE_QDISCS if self.qdiscs.get(q)), None) if self.root and self.tc else None

    @property
    def netem(self) -> bool:
        return self.root and self.tc and self.qdiscs.get("netem", False)

    def describe(self) -> dict[str, Any]:
        return {"root": self.root, "tc": self.tc, "qdiscs": dict(self.qdiscs), "notes": list(self.notes),
                "rate_backend": self.rate_qdisc or "userspace",
                "delay_backend": "netem" if self.netem else "userspace"}


USERSPACE_ONLY = Capabilities(root=False, tc=False, qdiscs=dict.fromkeys(PROBED_QDISCS, False),
                              notes=("kernel shaping not probed: user-space shaper only",))


def probe(runner: Runner = run_command) -> Capabilities:
    """Try every qdisc in PROBED_QDISCS on a veth in a throw-away namespace; delete the namespace after."""
    is_root = os.geteuid() == 0
    has_tc = shutil.which("tc") is not None and shutil.which("ip") is not None
    if not (is_root and has_tc):
        why = "not root" if not is_root else "tc or ip not on PATH"
        return Capabilities(is_root, has_tc, dict.fromkeys(PROBED_QDISCS, False), (f"{why}: user-space shaper only",))
    namespace = f"{new_run_id()}probe"
    found: dict[str, bool] = {}
    notes: list[str] = []
    runner(commands.netns_add_argv(namespace))
    try:
        runner(commands.veth_add_argv(namespace, "p0", namespace, "p1", 1500))
        for qdisc, options in PROBED_QDISCS.items():
            try:
                runner(["tc", "-n", namespace, "qdisc", "add", "dev", "p0", "root", "handle", "1:", *options])
            except CommandFailed as exc:
                found[qdisc] = False
                notes.append(f"{qdisc}: {exc.stderr}")
            else:
                found[qdisc] = True
                runner(commands.unshape_argv(namespace, "p0"))
    finally:
        runner(commands.netns_del_argv(namespace))  # takes the veth pair with it
    return Capabilities(True, True, found, tuple(notes))


@dataclass(frozen=True)
class Plan:
    """Who realises each property of one spec: "tbf", "htb", "netem", "userspace", or None (not asked for)."""

    rate: str | None
    delay: str | None
    loss: str | None

    @property
    def rate_qdisc(self) -> str | None:
        return self.rate if self.rate in RATE_QDISCS else None

    @property
    def use_netem(self) -> bool:
        return "netem" in (self.delay, self.loss)

    @property
    def needs_userspace_delay(self) -> bool:
        return self.delay == "userspace"

    def describe(self) -> dict[str, Any]:
        return {"rate": self.rate, "latency": self.delay, "jitter": self.delay, "loss": self.loss}


def plan(spec: LinkSpec, caps: Capabilities) -> Plan:
    """Pick a back-end per property, or raise ShapingError naming what cannot be realised here."""
    rate = None if spec.rate_Bps is None else (caps.rate_qdisc or "userspace")
    delay = None
    if spec.has_delay:
        delay = "netem" if caps.netem else "userspace"
        if delay == "userspace" and spec.latency_s < USERSPACE_MIN_LATENCY_S:
            raise ShapingError(
                "latency_s", spec.latency_s,
                f"cannot be realised here: netem is missing and the user-space delay line's floor is "
                f"{USERSPACE_MIN_LATENCY_S * 1e3:g} ms (event-loop timer granularity)")
    loss = None
    if spec.has_loss:
        if not caps.netem:
            # A user-space shaper sits on a reliable byte stream: dropping bytes there would corrupt the stream,
            # and emulating TCP's recovery (retransmit delay) would be a model, not a measurement. Refuse.
            raise ShapingError(
                "loss_pct" if spec.gilbert_elliott is None else "gilbert_elliott",
                spec.loss_pct if spec.gilbert_elliott is None else spec.gilbert_elliott,
                "cannot be realised here: packet loss needs tc netem (missing), and the user-space shaper "
                "works on a reliable byte stream, where a lost packet is not observable")
        loss = "netem"
    return Plan(rate=rate, delay=delay, loss=loss)
