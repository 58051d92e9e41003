"""Shaped-link fidelity: achieved / configured TCP goodput from 10 Mbit/s up to the veth's own limit.

    sudo python benchmarks/shaped_links.py [--seconds 2] [--json]

Each rate gets a fresh `kvt<6hex>-` namespace pair with tbf (or htb) on the veth, a TCP bulk transfer measured
at the receiver after a 0.5 s warm-up, and is torn down. The unshaped veth is measured first: that is the
ceiling no shaper can exceed on this host. The "faithful up to" figure is the highest rate below the first one
whose achieved/configured leaves the ±5 % band (the system tests' tolerance). Also measures the user-space
delay line at a few latencies. Not part of the test pass/fail.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from kvtransit.shaping.backend import probe
from kvtransit.shaping.linktest import run_link_test
from kvtransit.shaping.spec import LinkSpec
from kvtransit.shaping.topology import LinkPlan, build_testbed

RATES_MBIT = [10, 50, 100, 200, 500, 1000, 2000, 4000, 6000, 8000, 10000, 12000]
LATENCIES_MS = [1, 5, 20, 50]
TOLERANCE = 0.05  # the system tests' ±5 %


def unshaped_ceiling_bps(seconds: float, caps) -> float:
    """Goodput of the bare veth: the same measurement with the rate left unshaped (a 1 Tbit/s tbf is not
    "unshaped", so this builds a link with no spec and measures it directly)."""
    from kvtransit.shaping import linktest

    bed = build_testbed(["src", "dst"], [LinkPlan("src", "dst")], capabilities=caps)
    try:
        sink = linktest._Process(linktest._python_in(bed.namespace("dst"), "measure", "sink", "0.0.0.0", 5201))  # noqa: S104
        bulk = None
        try:
            sink.line()
            bulk = linktest._Process(linktest._python_in(bed.namespace("src"), "measure", "bulk",
                                                         bed.address("dst", "src"), 5201, "--seconds", seconds + 0.5))
            return sink.finish(timeout=seconds * 4 + 10)["goodput_Bps"] * 8
        finally:
            sink.close()
            if bulk is not None:
                bulk.close()
    finally:
        bed.cleanup()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("benchmarks/shaped_links.py needs root (network namespaces and tc)")
    caps = probe()
    ceiling = unshaped_ceiling_bps(args.seconds, caps)
    rows = []
    for mbit in RATES_MBIT:
        result = run_link_test(LinkSpec(rate_Bps=mbit * 1e6 / 8), seconds=args.seconds, capabilities=caps)
        rows.append({"configured_mbit": mbit, "achieved_mbit": result["achieved_bps"] / 1e6,
                     "ratio": result["achieved_bps"] / result["configured_bps"], "backend": result["backends"]["rate"]})
    faithful_up_to = None
    for row in rows:
        if abs(row["ratio"] - 1) > TOLERANCE:
            break
        faithful_up_to = row["configured_mbit"]
    delays = []
    for ms in LATENCIES_MS:
        result = run_link_test(LinkSpec(latency_s=ms / 1e3), rtt_count=100, capabilities=caps)
        delays.append({"configured_ms": ms, "achieved_ms": result["achieved_latency_s"] * 1e3,
                       "error_ms": (result["achieved_latency_s"] - ms / 1e3) * 1e3,
                       "backend": result["backends"]["latency"]})
    report = {"unshaped_veth_mbit": ceiling / 1e6, "rates": rows, "faithful_up_to_mbit": faithful_up_to,
              "delays": delays, "capabilities": caps.describe()}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"unshaped veth goodput: {ceiling / 1e6:,.0f} Mbit/s   (back-ends: {caps.describe()['rate_backend']}, "
          f"delay {caps.describe()['delay_backend']})")
    print(f"{'configured Mbit/s':>18} {'achieved Mbit/s':>16} {'ratio':>8}")
    for row in rows:
        print(f"{row['configured_mbit']:>18,} {row['achieved_mbit']:>16,.1f} {row['ratio']:>8.4f}")
    print(f"faithful (within ±{TOLERANCE:.0%}) up to {faithful_up_to} Mbit/s")
    print(f"{'configured ms':>14} {'achieved ms':>12} {'error ms':>9}")
    for row in delays:
        print(f"{row['configured_ms']:>14} {row['achieved_ms']:>12.3f} {row['error_ms']:>+9.3f}  {row['backend']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
