"""Link specs to tc / ip commands, as plain argv lists (mininet's TCIntf idea, minus the shell strings).

Nothing here runs anything: a runner (runner.py) does. Every function returns the exact argv, so unit tests
can pin it and a failing command can be reported verbatim.

Rate: `tbf` (or `htb` + `bfifo` where tbf is missing) as the root qdisc with handle 1:. Delay, jitter and loss:
`netem` as its child (parent 1:1, handle 10:) or as the root when there is no rate. The configured rate is the
TCP *goodput*; the wire rate handed to tc adds the per-segment header overhead (wire_rate_Bps).
"""

from __future__ import annotations

import math

from kvtransit.shaping.spec import LinkSpec
from kvtransit.shaping.units import format_rate_bits, format_time_us

# What tc's rate counts per MTU-sized TCP segment on a veth, beyond the payload:
ETHERNET_HEADER_BYTES = 14  # dst + src MAC + EtherType (IEEE 802.3); veth has no preamble, FCS or gap
TCP_IP_HEADER_BYTES = 52  # IPv4 20 + TCP 20 + timestamps option 12 (RFC 7323, on by default in Linux)
# veth hands tbf GSO super-packets up to gso_max_size (65536 here, `ip -d link show`). A bucket smaller than a
# couple of them makes tbf split and pace per packet, and the rate falls short: measured on this host, burst
# 64 KiB gave 0.994 of 500 Mbit/s and 0.71 of 2 Gbit/s, 2 x 64 KiB or >= 0.8 ms of rate gave 1.0000.
GSO_MAX_BYTES = 65536
BURST_SECONDS = 0.001  # bucket depth in time: rate x 1 ms (timer slack at high rate), see above
# Queue floor when the link adds no latency: enough for TCP to keep the bucket busy without drops.
MIN_QUEUE_SECONDS = 0.02
NETEM_HANDLE = "10:"
ROOT_HANDLE = "1:"
RATE_CLASS = "1:1"  # tbf's single inner class / our htb class


def wire_rate_Bps(goodput_Bps: float, mtu: int) -> float:
    """The rate tc must enforce so full-MTU TCP segments deliver `goodput_Bps` of payload.

    tc counts Ethernet frame bytes (mtu + 14) per segment that carries mtu - 52 payload bytes.
    """
    return goodput_Bps * (mtu + ETHERNET_HEADER_BYTES) / (mtu - TCP_IP_HEADER_BYTES)


def burst_bytes(wire_Bps: float) -> int:
    return int(max(2 * GSO_MAX_BYTES, math.ceil(wire_Bps * BURST_SECONDS)))


def queue_limit_bytes(spec: LinkSpec, wire_Bps: float) -> int:
    """At least the bandwidth-delay product (of the added round trip, floored), never below the user's limit."""
    delay = max(2 * (spec.latency_s + spec.jitter_s), MIN_QUEUE_SECONDS)
    bdp = math.ceil(wire_Bps * delay)
    return int(max(bdp, 3 * burst_bytes(wire_Bps), spec.limit_bytes or 0))


def queue_limit_packets(spec: LinkSpec) -> int:
    """netem's limit is in packets: the byte queue over the smallest frame we expect at full rate (MTU)."""
    wire = wire_rate_Bps(spec.rate_Bps, spec.mtu) if spec.rate_Bps else 0.0
    # Without a rate, netem holds whatever arrives during the delay; size for 10 Gbit/s (veth reaches ~15).
    wire = wire or 1.25e9
    return max(1000, math.ceil(queue_limit_bytes(spec, wire) / (spec.mtu + ETHERNET_HEADER_BYTES)))


# A namespace of None is the root (the launcher's own) namespace: the command runs there, without `-n`.


def _tc(namespace: str | None, *args: str) -> list[str]:
    return ["tc", *(("-n", namespace) if namespace is not None else ()), *args]


def _ip(namespace: str | None, *args: str) -> list[str]:
    return ["ip", *(("-n", namespace) if namespace is not None else ()), *args]


# -- rate -----------------------------------------------------------------------------------------------


def rate_argv(namespace: str | None, dev: str, spec: LinkSpec, qdisc: str = "tbf",
              verb: str = "add") -> list[list[str]]:
    """The root rate limiter. verb "add" builds it; "change" retunes it in place (same qdisc, same handle)."""
    assert spec.rate_Bps is not None, "rate_argv needs a spec with a rate"
    wire = wire_rate_Bps(spec.rate_Bps, spec.mtu)
    rate, burst, limit = format_rate_bits(wire), str(burst_bytes(wire)), str(queue_limit_bytes(spec, wire))
    if qdisc == "tbf":
        return [_tc(namespace, "qdisc", verb, "dev", dev, "root", "handle", ROOT_HANDLE, "tbf",
                    "rate", rate, "burst", burst, "limit", limit)]
    if qdisc == "htb":
        klass = _tc(namespace, "class", verb, "dev", dev, "parent", ROOT_HANDLE, "classid", RATE_CLASS, "htb",
                    "rate", rate, "ceil", rate, "burst", burst, "cburst", burst)
        if verb == "change":
            return [klass]
        return [
            _tc(namespace, "qdisc", "add", "dev", dev, "root", "handle", ROOT_HANDLE, "htb", "default", "1"),
            klass,
        ]
    raise ValueError(f"no rate qdisc {qdisc!r}")


def htb_queue_argv(namespace: str | None, dev: str, spec: LinkSpec, verb: str = "add") -> list[str]:
    """htb's leaf queue, bounded in bytes like tbf's limit (htb alone would use txqueuelen packets)."""
    assert spec.rate_Bps is not None, "htb_queue_argv needs a spec with a rate"
    wire = wire_rate_Bps(spec.rate_Bps, spec.mtu)
    return _tc(namespace, "qdisc", verb, "dev", dev, "parent", RATE_CLASS, "handle", NETEM_HANDLE, "bfifo",
               "limit", str(queue_limit_bytes(spec, wire)))


# -- delay, jitter, loss --------------------------------------------------------------------------------


def netem_options(spec: LinkSpec) -> list[str]:
    """netem(8) options for the spec's delay, jitter and loss (an empty delay is "delay 0us")."""
    opts = ["limit", str(queue_limit_packets(spec)), "delay", format_time_us(spec.latency_s)]
    if spec.jitter_s:
        opts.append(format_time_us(spec.jitter_s))
        if spec.correlation_pct:
            opts.append(f"{spec.correlation_pct:g}%")
        if spec.distribution != "uniform":  # netem's jitter is uniform unless a table is named
            opts += ["distribution", spec.distribution]
    if spec.gilbert_elliott is not None:
        ge = spec.gilbert_elliott
        opts += ["loss", "gemodel", f"{ge.p_pct:g}%", f"{ge.r_pct:g}%", f"{ge.loss_bad_pct:g}%",
                 f"{ge.loss_good_pct:g}%"]
    elif spec.loss_pct:
        opts += ["loss", "random", f"{spec.loss_pct:g}%"]
        if spec.loss_correlation_pct:
            opts.append(f"{spec.loss_correlation_pct:g}%")
    return opts


def netem_argv(namespace: str | None, dev: str, spec: LinkSpec, *, under_rate: bool, verb: str = "add") -> list[str]:
    where = ["parent", RATE_CLASS, "handle", NETEM_HANDLE] if under_rate else ["root", "handle", ROOT_HANDLE]
    return _tc(namespace, "qdisc", verb, "dev", dev, *where, "netem", *netem_options(spec))


def shape_argv(namespace: str | None, dev: str, spec: LinkSpec, rate_qdisc: str | None, use_netem: bool,
               verb: str = "add") -> list[list[str]]:
    """Everything that shapes one device's egress, in the order to run it."""
    argvs: list[list[str]] = []
    has_rate = spec.rate_Bps is not None and rate_qdisc is not None
    if has_rate and rate_qdisc is not None:  # (has_rate says so already; mypy needs it spelled out)
        argvs += rate_argv(namespace, dev, spec, rate_qdisc, verb)
    if use_netem:
        argvs.append(netem_argv(namespace, dev, spec, under_rate=has_rate, verb=verb))
    elif has_rate and rate_qdisc == "htb":
        argvs.append(htb_queue_argv(namespace, dev, spec, verb))
    return argvs


def unshape_argv(namespace: str | None, dev: str) -> list[str]:
    return _tc(namespace, "qdisc", "del", "dev", dev, "root")


# -- namespaces, veths, addresses -----------------------------------------------------------------------


def netns_add_argv(name: str) -> list[str]:
    return ["ip", "netns", "add", name]


def netns_del_argv(name: str) -> list[str]:
    return ["ip", "netns", "del", name]


def netns_list_argv() -> list[str]:
    return ["ip", "netns", "list"]


# Set in each namespace a run makes (never in the root namespace: the host's settings are not ours to change).
# A hand-off after an idle gap must not restart TCP's slow start: the modelled link (docs/reference.md §2) carries
# latency + bytes / bw from a transfer's first byte, while Linux's default (tcp_slow_start_after_idle = 1, RFC 2861's
# congestion window validation) halves the window for every RTO of idle, down to the initial window, so a transfer after
# a second's idle ramps up again through tbf's queue. Measured here between two namespaces through tbf (2 MB at 50 MB/s,
# i.e. 40 ms, after idle gaps of 0.05–1.3 s): with it on, up to +10 to +17 ms after the 1.3 s gap; off, with CUBIC
# (runtime/transport/tcp_options.py), +2 to +10 ms. What remains after long gaps follows this VM's own wake-up after
# idle (the same with the CPU kept out of idle states), and varies with the VM's state over a day.
NAMESPACE_SYSCTLS: tuple[tuple[str, str], ...] = (("net.ipv4.tcp_slow_start_after_idle", "0"),)


def sysctl_argv(namespace: str, key: str, value: str) -> list[str]:
    """Set a per-namespace sysctl inside `namespace` (a namespace is required: see NAMESPACE_SYSCTLS)."""
    return exec_argv(namespace, ["sysctl", "-q", "-w", f"{key}={value}"])


def veth_add_argv(namespace: str | None, dev: str, peer_namespace: str | None, peer: str, mtu: int) -> list[str]:
    """Both ends born inside their namespaces: nothing appears in the root namespace unless an end is asked
    for there (namespace None)."""
    def where(ns: str | None) -> list[str]:
        return ["netns", ns] if ns is not None else []

    return ["ip", "link", "add", dev, *where(namespace), "mtu", str(mtu), "type", "veth",
            "peer", "name", peer, *where(peer_namespace), "mtu", str(mtu)]


def link_del_argv(namespace: str | None, dev: str) -> list[str]:
    return _ip(namespace, "link", "del", dev)


def link_list_argv(namespace: str | None) -> list[str]:
    return _ip(namespace, "-o", "link", "show")


def addr_add_argv(namespace: str | None, dev: str, cidr: str) -> list[str]:
    return _ip(namespace, "addr", "add", cidr, "dev", dev)


def link_set_argv(namespace: str | None, dev: str, state: str) -> list[str]:
    if state not in ("up", "down"):
        raise ValueError(f"link state {state!r}")
    return _ip(namespace, "link", "set", dev, state)


def exec_argv(namespace: str | None, argv: list[str]) -> list[str]:
    """Run a program inside a namespace (the root namespace: as it is)."""
    return ["ip", "netns", "exec", namespace, *argv] if namespace is not None else list(argv)


def route_list_argv(namespace: str | None) -> list[str]:
    """IPv4 routes, one per line (`-o`): which subnets a namespace already uses."""
    return _ip(namespace, "-o", "-4", "route", "show")
