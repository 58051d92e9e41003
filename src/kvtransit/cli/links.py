"""`kvtransit links`: the shaped link on its own: probe the kernel, measure a spec, clean up a crashed run.

  kvtransit links probe [--json]                 which qdiscs this kernel has, and the back-end each property uses
  kvtransit links test --rate 200mbit [--latency 5ms] [--json]
  kvtransit links test --preset eth-25g --scale 0.004 [--latency 5ms]
                                                 build a throw-away namespace pair, measure configured vs achieved
                                                 goodput and added latency, remove everything it made
  kvtransit links clean --manifest PATH          remove exactly what a run's manifest lists (after a crash)

Presets are docs/reference.md §2's links; their rate is multiplied by the payload scale (ARCHITECTURE.md, time
and scale).
"""

from __future__ import annotations

import argparse

from kvtransit.cli._common import CliError, add_json_flag, print_json, print_table


def register(subparsers) -> None:
    p = subparsers.add_parser("links", help="probe, test and clean up shaped links (tc in network namespaces)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="links_command", metavar="ACTION", parser_class=type(p))
    sub.required = True

    probe = sub.add_parser("probe", help="which qdiscs this kernel has and which back-end shapes what")
    add_json_flag(probe)
    probe.set_defaults(func=run_probe)

    test = sub.add_parser("test", help="measure configured vs achieved on a throw-away namespace pair")
    test.add_argument("--rate", help="goodput to shape to, tc style: 200mbit, 1gbit, 25mbps (bytes)")
    test.add_argument("--preset", help="a docs/reference.md §2 link (eth-25g, ib-ndr, ...): its rate x --scale, its "
                      "latency")
    test.add_argument("--scale", type=float, default=1.0, help="payload scale s applied to the preset's rate")
    test.add_argument("--latency", help="added one-way latency, e.g. 5ms (overrides the preset's)")
    test.add_argument("--jitter", help="latency jitter, e.g. 1ms")
    test.add_argument("--distribution", default="normal", help="jitter distribution: normal, uniform, pareto")
    test.add_argument("--loss", type=float, default=0.0, help="random loss in percent (needs netem)")
    test.add_argument("--seconds", type=float, default=3.0, help="bulk transfer length (after a 0.5 s warm-up)")
    add_json_flag(test)
    test.set_defaults(func=run_test)

    clean = sub.add_parser("clean", help="remove exactly what a manifest lists")
    clean.add_argument("--manifest", required=True, help="the run's manifest JSON")
    clean.set_defaults(func=run_clean)


def preset_spec(name: str, scale: float):
    """A docs/reference.md §2 link as a LinkSpec: rate = bandwidth x scale, latency as listed (never scaled)."""
    from kvtransit.model.catalog.links import link_by_name
    from kvtransit.shaping.spec import LinkSpec

    link = link_by_name(name)
    return LinkSpec(rate_Bps=link.bandwidth_Bps, latency_s=link.latency_s, name=name).scaled(scale)


def spec_from_args(args: argparse.Namespace):
    from dataclasses import replace

    from kvtransit.shaping.spec import LinkSpec
    from kvtransit.shaping.units import parse_rate, parse_time

    if args.preset and args.rate:
        raise CliError("give --rate or --preset, not both")
    base = preset_spec(args.preset, args.scale) if args.preset else LinkSpec()
    changes = {"distribution": args.distribution, "loss_pct": args.loss}
    if args.rate:
        changes["rate_Bps"] = parse_rate(args.rate, "--rate")
    if args.latency is not None:
        changes["latency_s"] = parse_time(args.latency, "--latency")
    if args.jitter is not None:
        changes["jitter_s"] = parse_time(args.jitter, "--jitter")
    spec = replace(base, **changes)
    if spec.rate_Bps is None and not spec.has_delay and not spec.has_loss:
        raise CliError("nothing to test: give --rate, --preset, --latency or --loss")
    return spec


def run_probe(args: argparse.Namespace) -> int:
    from kvtransit.shaping.backend import probe

    caps = probe()
    if args.json:
        print_json(caps.describe())
        return 0
    rows = [[q, "yes" if ok else "no"] for q, ok in caps.qdiscs.items()]
    print_table("tc qdiscs on this kernel", ["qdisc", "available"], rows)
    print(f"root: {'yes' if caps.root else 'no'}; tc: {'yes' if caps.tc else 'no'}")
    print(f"rate:          {caps.rate_qdisc or 'userspace (TokenBucket)'}")
    print(f"delay, jitter: {'netem' if caps.netem else 'userspace (DelayLine; falls back from netem)'}")
    print(f"loss:          {'netem' if caps.netem else 'unavailable (needs netem; refused, never faked)'}")
    return 0


def _fmt(value, scale: float, unit: str) -> str:
    return "-" if value is None else f"{value * scale:,.3f} {unit}"


def run_test(args: argparse.Namespace) -> int:
    from kvtransit.shaping.backend import probe
    from kvtransit.shaping.linktest import run_link_test

    spec = spec_from_args(args)
    if args.seconds <= 0:
        raise CliError(f"--seconds must be > 0, got {args.seconds!r}")
    caps = probe()
    if not caps.kernel_shaping:
        raise CliError("links test needs root and tc with tbf or htb (probe: " + "; ".join(caps.notes) + ")")
    result = run_link_test(spec, seconds=args.seconds, capabilities=caps)
    if args.json:
        print_json(result)
        return 0
    rows = []
    if result["configured_bps"] is not None:
        ratio = result["achieved_bps"] / result["configured_bps"]
        rows.append(["goodput", _fmt(result["configured_bps"], 1e-6, "Mbit/s"),
                     _fmt(result["achieved_bps"], 1e-6, "Mbit/s"), f"{ratio:.4f}", result["backends"]["rate"]])
    if result["configured_latency_s"] is not None:
        rows.append(["added latency", _fmt(result["configured_latency_s"], 1e3, "ms"),
                     _fmt(result["achieved_latency_s"], 1e3, "ms"),
                     f"{result['achieved_latency_s'] - result['configured_latency_s']:+.6f} s",
                     result["backends"]["latency"]])
    print_table("configured vs achieved", ["property", "configured", "achieved", "ratio / error", "back-end"], rows)
    return 0


def run_clean(args: argparse.Namespace) -> int:
    from kvtransit.shaping.manifest import Manifest, cleanup

    manifest = Manifest.load(args.manifest)
    ran = cleanup(manifest)
    for argv in ran:
        print(" ".join(argv))
    print(f"removed {len(ran)} item(s) of run {manifest.run_id}; nothing else touched")
    return 0
