"""Specs become exact tc argv lists; the plan says who realises each property, or refuses before anything runs."""

from __future__ import annotations

import pytest

from kvtransit.shaping import commands
from kvtransit.shaping.backend import Capabilities, plan
from kvtransit.shaping.errors import ShapingError
from kvtransit.shaping.spec import GilbertElliott, LinkSpec

NO_NETEM = Capabilities(root=True, tc=True, qdiscs={"tbf": True, "htb": True, "netem": False, "bfifo": True})
WITH_NETEM = Capabilities(root=True, tc=True, qdiscs={"tbf": True, "htb": True, "netem": True, "bfifo": True})
HTB_ONLY = Capabilities(root=True, tc=True, qdiscs={"tbf": False, "htb": True, "netem": False, "bfifo": True})


def test_wire_rate_adds_ethernet_and_tcp_ip_header_overhead():
    # A 1500-byte MTU segment carries 1448 payload bytes (52 B of IP+TCP+timestamps) in a 1514-byte frame.
    assert commands.wire_rate_Bps(1448.0, 1500) == pytest.approx(1514.0)


def test_tbf_argv_for_100_mbit_goodput():
    spec = LinkSpec.parse(rate="100mbit")
    # wire = 100e6 x 1514/1448 = 104,558,011 bit/s; burst = 2 x 64 KiB (GSO); limit = max(20 ms x rate, 3 bursts).
    assert commands.shape_argv("ns1", "d0", spec, "tbf", use_netem=False) == [
        ["tc", "-n", "ns1", "qdisc", "add", "dev", "d0", "root", "handle", "1:", "tbf",
         "rate", "104558011bit", "burst", "131072", "limit", "393216"],
    ]


def test_tbf_burst_grows_with_rate_at_high_rates():
    spec = LinkSpec.parse(rate="2gbit")
    argv = commands.shape_argv("ns1", "d0", spec, "tbf", use_netem=False)[0]
    # wire 2,091,160,221 bit/s = 261,395,028 B/s: 1 ms of it = 261,396 B; limit = 20 ms of it = 5,227,901 B.
    assert argv[argv.index("burst") + 1] == "261396"
    assert argv[argv.index("limit") + 1] == "5227901"


def test_queue_is_at_least_the_bandwidth_delay_product():
    spec = LinkSpec.parse(rate="1gbit", latency="50ms")
    wire = commands.wire_rate_Bps(spec.rate_Bps, spec.mtu)
    assert commands.queue_limit_bytes(spec, wire) >= wire * 2 * 0.05


def test_htb_argv_has_class_and_byte_queue():
    spec = LinkSpec.parse(rate="100mbit")
    assert commands.shape_argv("ns1", "d0", spec, "htb", use_netem=False) == [
        ["tc", "-n", "ns1", "qdisc", "add", "dev", "d0", "root", "handle", "1:", "htb", "default", "1"],
        ["tc", "-n", "ns1", "class", "add", "dev", "d0", "parent", "1:", "classid", "1:1", "htb",
         "rate", "104558011bit", "ceil", "104558011bit", "burst", "131072", "cburst", "131072"],
        ["tc", "-n", "ns1", "qdisc", "add", "dev", "d0", "parent", "1:1", "handle", "10:", "bfifo", "limit", "393216"],
    ]


def test_netem_sits_under_tbf_with_delay_jitter_distribution_and_loss():
    spec = LinkSpec.parse(rate="100mbit", latency="5ms", jitter="1ms", loss_pct=0.5, correlation_pct=25.0)
    argvs = commands.shape_argv("ns1", "d0", spec, "tbf", use_netem=True)
    assert argvs[1] == ["tc", "-n", "ns1", "qdisc", "add", "dev", "d0", "parent", "1:1", "handle", "10:", "netem",
                        "limit", "1000", "delay", "5000us", "1000us", "25%", "distribution", "normal",
                        "loss", "random", "0.5%"]


def test_netem_alone_is_the_root_and_gemodel_loss_is_spelled_like_netem():
    spec = LinkSpec(latency_s=0.02, jitter_s=0.002, distribution="uniform",
                    gilbert_elliott=GilbertElliott(p_pct=1.0, r_pct=10.0, loss_bad_pct=50.0))
    # No rate: the queue is sized for 10 Gbit/s over 2 x (20 + 2) ms = 55 MB = 36,328 full frames.
    assert commands.shape_argv("ns1", "d0", spec, None, use_netem=True) == [
        ["tc", "-n", "ns1", "qdisc", "add", "dev", "d0", "root", "handle", "1:", "netem", "limit", "36328",
         "delay", "20000us", "2000us", "loss", "gemodel", "1%", "10%", "50%", "0%"],
    ]


def test_change_retunes_the_same_qdisc_in_place():
    argvs = commands.shape_argv("ns1", "d0", LinkSpec.parse(rate="50mbit"), "tbf", use_netem=False, verb="change")
    assert argvs[0][:11] == ["tc", "-n", "ns1", "qdisc", "change", "dev", "d0", "root", "handle", "1:", "tbf"]


def test_veths_are_born_inside_their_namespaces():
    assert commands.veth_add_argv("nsA", "a0", "nsB", "b0", 1500) == [
        "ip", "link", "add", "a0", "netns", "nsA", "mtu", "1500", "type", "veth",
        "peer", "name", "b0", "netns", "nsB", "mtu", "1500"]


def test_plan_prefers_tbf_and_falls_back_to_userspace_delay_without_netem():
    p = plan(LinkSpec.parse(rate="100mbit", latency="5ms"), NO_NETEM)
    assert (p.rate, p.delay, p.loss) == ("tbf", "userspace", None)
    assert p.needs_userspace_delay and not p.use_netem


def test_plan_uses_netem_where_the_kernel_has_it():
    p = plan(LinkSpec.parse(rate="100mbit", latency="5ms", loss_pct=1.0), WITH_NETEM)
    assert (p.rate, p.delay, p.loss) == ("tbf", "netem", "netem")


def test_plan_falls_back_to_htb_when_tbf_is_missing():
    assert plan(LinkSpec.parse(rate="100mbit"), HTB_ONLY).rate == "htb"


def test_loss_without_netem_is_refused_as_unrealisable():
    with pytest.raises(ShapingError, match=r"loss_pct=1\.0: cannot be realised"):
        plan(LinkSpec(rate_Bps=1e6, loss_pct=1.0), NO_NETEM)


def test_microsecond_latency_without_netem_is_refused():
    # docs/reference.md §2's eth-25g adds 20 us: below the user-space delay line's 1 ms floor.
    with pytest.raises(ShapingError, match="latency_s=2e-05"):
        plan(LinkSpec(rate_Bps=1e6, latency_s=20e-6), NO_NETEM)
    assert plan(LinkSpec(rate_Bps=1e6, latency_s=20e-6), WITH_NETEM).delay == "netem"
