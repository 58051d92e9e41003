"""Where `kvtransit up` puts its processes and who shapes the hand-off link: network namespaces + tc, or loopback.

    setup = choose_links(scenario, "auto", manifest_path=run_dir / "links.json")   # may build a testbed
    try:
        setup.host("decode", "kv")               # where decode's KV socket listens (the middlebox connects there)
        setup.wrap("decode", argv)                # `ip netns exec …` for agents inside a namespace
    finally:
        setup.cleanup()

The netns topology keeps the load generator and prefill (and the launcher, and Prometheus) in the root
namespace and puts the middlebox and the decode pool in namespaces of their own:

    root (loadgen, prefill, launcher) ──veth──▶ middlebox ns ══veth, tc tbf══▶ decode ns
             └─────────────────────────────────veth──────────────────────────────▲

Only the middlebox → decode veth is shaped (its tbf rate is the scenario's scaled link rate, as goodput: the
shaping layer adds the header overhead). The two root veths are unshaped; they are how the root namespace
reaches every agent's /metrics, /stats and ports, with plain connected routes (no forwarding, no NAT). The
decode pool shares one namespace, so it shares the one shaped link (docs/reference.md §4: one shared FIFO link).

The link's latency (× dilation, e.g. 20 µs) stays with the middlebox's user-space delay line either way: the
middlebox always holds it, so a netem delay on the veth too would count it twice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvtransit.model.errors import ConfigError
from kvtransit.model.scenario import Scenario
from kvtransit.shaping.backend import Capabilities, probe
from kvtransit.shaping.errors import ShapingError
from kvtransit.shaping.runner import Runner, run_command
from kvtransit.shaping.spec import SHAPED_MTU, WIRING_MTU, LinkSpec
from kvtransit.shaping.topology import ROOT_AGENT, LinkPlan, Testbed, build_testbed

LINK_MODES = ("auto", "netns", "loopback")
LOOPBACK = "127.0.0.1"
# Namespaces (topology agent names) of the roles that do not run in the root namespace.
MIDDLEBOX_NS, DECODE_NS = "middlebox", "decode"
# Inside our own namespaces: no TCP slow-start restart after idle. The modelled link is a dedicated path
# that carries each hand-off at its full rate from the first byte; a TCP flow re-probing its window after
# every idle gap would add ramp-up time the model does not have. (Per-namespace sysctl: gone with the netns.)
NO_SLOW_START_AFTER_IDLE = ["sysctl", "-qw", "net.ipv4.tcp_slow_start_after_idle=0"]
# ... and a queue-filling (loss-based) congestion control, not the host's BBR: BBR paces at its estimate of
# the bottleneck and cycles its gain down to 0.75, so tbf's bucket went idle and the hand-off link delivered
# ~0.87 of its rate (measured here). Reno keeps tbf's queue non-empty, so tbf alone sets the rate. (Reno, not
# cubic: a child namespace may only pick from tcp_allowed_congestion_control, and reno is always in it.)
LOSS_BASED_CC = ["sysctl", "-qw", "net.ipv4.tcp_congestion_control=reno"]


class LinksUnavailable(ConfigError):
    """`--links netns` was asked for and this host cannot give it (the message says why)."""


@dataclass
class LinkSetup:
    """The chosen mode, the back-end of each link property, and (netns) the built testbed."""

    mode: str  # "netns" or "loopback"
    reason: str  # why this mode (what auto found, or what was asked for)
    backends: dict  # {"rate": "tc tbf" | "tc htb" | "userspace", "delay": "userspace" | "netem"}
    testbed: Testbed | None = None
    manifest_path: Path | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def link_backend(self) -> str:
        """The agents' `--link-backend`: who shapes the rate."""
        return "tc" if self.mode == "netns" else "userspace"

    def host(self, role: str, socket: str = "front") -> str:
        """The address `role`'s socket listens on: `socket` "kv" is decode's KV ingress (reached over the shaped
        link); "front" is everything the root namespace reaches (ingress, /metrics, control, client ports)."""
        if self.testbed is None or role not in ("middlebox", "decode"):
            return LOOPBACK
        if role == "decode" and socket == "kv":
            return self.testbed.address(DECODE_NS, MIDDLEBOX_NS)
        return self.testbed.address(MIDDLEBOX_NS if role == "middlebox" else DECODE_NS, ROOT_AGENT)

    def wrap(self, role: str, argv: list[str]) -> list[str]:
        """The argv that runs `argv` where `role` lives."""
        if self.testbed is None or role not in ("middlebox", "decode"):
            return list(argv)
        return self.testbed.exec_argv(MIDDLEBOX_NS if role == "middlebox" else DECODE_NS, argv)

    def describe(self) -> dict:
        """For the report's `config.links` and `link.backends`."""
        out: dict[str, Any] = {"mode": self.mode, "reason": self.reason, "backends": dict(self.backends),
                               "notes": list(self.notes)}
        if self.testbed is not None:
            out["run_id"] = self.testbed.run_id
            out["manifest"] = str(self.manifest_path) if self.manifest_path else None
        return out

    def summary(self) -> str:
        """One line for the terminal."""
        where = ("network namespaces, the middlebox → decode veth shaped" if self.mode == "netns"
                 else "loopback, the middlebox's user-space shaper")
        line = (f"links: {self.mode} ({where}); rate: {self.backends['rate']}, delay: {self.backends['delay']}"
                f" — {self.reason}")
        if self.manifest_path is not None:
            line += f"; manifest {self.manifest_path}"
        return line

    def cleanup(self) -> None:
        """Remove every namespace, veth and qdisc of the run by exact name (a no-op for loopback)."""
        if self.testbed is not None:
            self.testbed.cleanup()

    def clean_hint(self) -> str:
        if self.manifest_path is None:
            return ""
        return (f"if any namespace or veth of this run is left, `kvtransit links clean --manifest "
                f"{self.manifest_path}` removes exactly those")


def _delay_backend_note(caps: Capabilities) -> str:
    if caps.netem:
        return ("delay: the middlebox's user-space delay line (netem is available but unused: the middlebox "
                "always holds the latency, netem would count it twice)")
    return "delay: the middlebox's user-space delay line (no netem on this kernel)"


def _why_not_netns(scenario: Scenario, caps: Capabilities) -> str | None:
    if not caps.kernel_shaping:
        missing = "not root" if not caps.root else "no tc/ip on PATH" if not caps.tc else "neither tbf nor htb"
        return f"kernel shaping unavailable ({missing})"
    if scenario.channels != 1:
        # tc shapes one aggregate queue; the scenario's channels each carry a hand-off at the full link rate.
        return f"--channels {scenario.channels}: tc shapes one queue, the user-space shaper has per-channel lanes"
    from kvtransit.harness.up.flow_launch import flow_launches

    return next((why for launch in flow_launches(scenario) if (why := launch.links_refusal(scenario))), None)


def choose_links(scenario: Scenario, mode: str, *, manifest_path: Path | None,
                 prober: Callable[[], Capabilities] = probe, runner: Runner = run_command,
                 run_id: str | None = None) -> LinkSetup:
    """Pick the mode (auto: netns when this host can, else loopback, saying why) and build the testbed for it
    (every ip/tc/sysctl command through `runner`). `netns` that cannot be had raises LinksUnavailable; a
    failure while building leaves nothing behind."""
    if mode not in LINK_MODES:
        raise ConfigError(f"--links: unknown value {mode!r} (choose from: {', '.join(LINK_MODES)})")
    userspace = {"rate": "userspace", "delay": "userspace"}
    if mode == "loopback":
        return LinkSetup("loopback", "asked for (--links loopback)", userspace)
    caps = prober()
    why_not = _why_not_netns(scenario, caps)
    if why_not is not None:
        if mode == "netns":
            raise LinksUnavailable(f"--links netns: {why_not}; use --links loopback (the user-space shaper)")
        return LinkSetup("loopback", f"auto: {why_not}", userspace)
    shaped = LinkSpec(rate_Bps=scenario.scaled_link.bandwidth_Bps, mtu=SHAPED_MTU, name=scenario.link)
    wiring = LinkSpec(mtu=WIRING_MTU, name="wiring")  # no rate, no delay: only the MTU
    links = [LinkPlan(ROOT_AGENT, MIDDLEBOX_NS, wiring), LinkPlan(MIDDLEBOX_NS, DECODE_NS, shaped),
             LinkPlan(ROOT_AGENT, DECODE_NS, wiring)]
    try:
        testbed = build_testbed([ROOT_AGENT, MIDDLEBOX_NS, DECODE_NS], links, runner=runner, capabilities=caps,
                                manifest_path=manifest_path, run_id=run_id)
    except ShapingError as exc:
        hint = (f"; `kvtransit links clean --manifest {manifest_path}` removes anything left" if manifest_path
                else "")
        raise LinksUnavailable(f"--links {mode}: building the network namespaces failed and what was made was "
                               f"rolled back: {exc}{hint}") from exc
    shaped_plan = testbed.link(MIDDLEBOX_NS, DECODE_NS).plan
    assert shaped_plan is not None  # build_testbed plans every link that has a spec, and this one has `shaped`
    rate_qdisc = shaped_plan.rate
    try:
        for namespace in (MIDDLEBOX_NS, DECODE_NS):
            for sysctl in (NO_SLOW_START_AFTER_IDLE, LOSS_BASED_CC):
                runner(testbed.exec_argv(namespace, sysctl))
    except ShapingError as exc:
        testbed.cleanup()
        raise LinksUnavailable(f"--links {mode}: tuning TCP in the run's namespaces failed (they were removed): "
                               f"{exc}") from exc
    setup = LinkSetup("netns", "asked for (--links netns)" if mode == "netns" else "auto: root with tc",
                      {"rate": f"tc {rate_qdisc}", "delay": "userspace"}, testbed, manifest_path)
    setup.notes.append(_delay_backend_note(caps))
    return setup
