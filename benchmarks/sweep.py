"""What a sweep costs on this host: wall time and CPU of one live run as the request rate and the payload
scale grow (a scaling curve), and the cost of a full preset sweep extrapolated from measured points.

    python benchmarks/sweep.py [--requests 40] [--rates 4 8 14] [--scales 0.0125 0.025 0.05 0.1]
                               [--validate 200] [--preset handoff-25g]

Each run is one point as `kvtransit sweep` runs it (PointRunner: the Launcher on loopback), eth-25g,
freq-keep-k in transit, the deck's lengths (2,048 / 256 tokens, cv 0.5), dilation 2. CPU = user + system
time of the run's child processes (getrusage of reaped children), so the launcher's own share is left out.

The model of a point's wall time: `overhead + arrivals_span_model_s × dilation + tail`, where the overhead
(process start-up, report) and tail (the last requests' decode) are taken from the measured runs, then
checked against a longer run (--validate N requests) before the preset's total is extrapolated.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
from pathlib import Path

from kvtransit.harness.studies.sweep.plan import preset, presets
from kvtransit.harness.studies.sweep.runner import PointRunner, sweep_points
from kvtransit.model.scenario import Scenario
from kvtransit.model.serving.workload import generate

BASE = dict(link="eth-25g", codec="freq-keep-k", compress_at="transit", dilation=2.0)


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def arrivals_span_s(scenario: Scenario) -> float:
    """Model seconds from the first to the last arrival (what the load generator must wait out)."""
    requests = generate(scenario.workload)
    return requests[-1].arrival_s


def link_backlog_s(scenario: Scenario) -> float:
    """Model seconds the hand-off link still owes after the last arrival when the load exceeds it: its total
    work (latency + wire bytes / bandwidth per request, docs/reference.md §2) less the arrivals' span, if positive."""
    link, ratio = scenario.link_spec, scenario.codec_declaration.ratio
    work = sum(link.latency_s + scenario.model_spec.kv_bytes(r.prompt_tokens) / ratio / link.bandwidth_Bps
               for r in generate(scenario.workload))
    return max(0.0, work - arrivals_span_s(scenario))


def estimated_wall_s(scenario: Scenario, overhead_s: float) -> float:
    return overhead_s + (arrivals_span_s(scenario) + link_backlog_s(scenario)) * scenario.effective_dilation


def measure(workdir: Path, scenario: Scenario, label: str) -> dict:
    runner = PointRunner(workdir, accuracy_sample=0)
    cpu_before = children_cpu_s()
    row = runner(label, scenario)
    cpu_s = children_cpu_s() - cpu_before
    span_wall_s = arrivals_span_s(scenario) * scenario.effective_dilation
    return {"label": label, "rate": scenario.rate, "scale": scenario.effective_scale, "requests": scenario.requests,
            "wall_s": row["wall_s"], "cpu_s": cpu_s, "span_wall_s": span_wall_s,
            "overhead_s": row["wall_s"] - span_wall_s, "faithful": row["faithful"], "status": row["status"],
            "scaled_link_MBps": scenario.scaled_link.bandwidth_Bps / 1e6, "attainment": row["slo_attainment"]}


def print_rows(title: str, rows: list[dict]) -> None:
    print(f"\n{title}")
    print("| rate | scale | scaled link MB/s | requests | wall s | CPU s | CPU / wall | wall - arrivals s | faithful |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['rate']:g} | {r['scale']:.4f} | {r['scaled_link_MBps']:.1f} | {r['requests']} | {r['wall_s']:.1f} "
              f"| {r['cpu_s']:.1f} | {r['cpu_s'] / r['wall_s']:.2f} | {r['overhead_s']:.1f} | "
              f"{r['faithful'] if r['status'] == 'ok' else 'failed'} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--rates", type=float, nargs="+", default=[4.0, 8.0, 14.0])
    parser.add_argument("--scales", type=float, nargs="+", default=[0.0125, 0.025, 0.05, 0.1])
    parser.add_argument("--scale", type=float, default=0.025, help="the scale of the rate curve")
    parser.add_argument("--validate", type=int, default=200, metavar="N",
                        help="requests of the longer run that checks the wall-time model (0: skip)")
    parser.add_argument("--preset", default="handoff-25g")
    parser.add_argument("--estimate-only", type=float, default=None, metavar="OVERHEAD_S",
                        help="skip the runs: estimate the presets from this measured per-point overhead")
    args = parser.parse_args()
    if args.estimate_only is not None:
        estimate_presets(args.estimate_only)
        return

    with tempfile.TemporaryDirectory(prefix="kvtransit-bench-sweep-") as tmp:
        work = Path(tmp)
        by_rate = [measure(work, Scenario.build(**BASE, rate=rate, requests=args.requests, scale=args.scale),
                           f"rate{rate}")
                   for rate in args.rates]
        print_rows(f"Rate curve ({args.requests} requests, scale {args.scale}, dilation 2)", by_rate)
        by_scale = [measure(work, Scenario.build(**BASE, rate=8.0, requests=args.requests, scale=scale),
                            f"scale{scale}")
                    for scale in args.scales]
        print_rows(f"Scale curve ({args.requests} requests at 8 req/s, dilation 2)", by_scale)

        overhead_s = statistics.median(r["overhead_s"] for r in by_rate)
        print(f"\nper-point overhead beyond the arrivals (start-up, drain of the last requests, report): "
              f"median {overhead_s:.1f} s")
        if args.validate:
            validate = Scenario.build(**BASE, rate=8.0, requests=args.validate, scale=args.scale)
            check = measure(work, validate, "validate")
            predicted = check["span_wall_s"] + overhead_s
            print_rows(f"Validation: {args.validate} requests at 8 req/s", [check])
            print(f"predicted wall {predicted:.1f} s, measured {check['wall_s']:.1f} s "
                  f"({check['wall_s'] / predicted - 1:+.1%})")

        estimate_presets(overhead_s)


def estimate_presets(overhead_s: float) -> None:
    for name in presets():
        points = sweep_points(preset(name))
        total = sum(estimated_wall_s(s, overhead_s) for _, s in points)
        longest = max(estimated_wall_s(s, overhead_s) for _, s in points)
        print(f"preset {name}: {len(points)} points of {points[0][1].requests} requests; estimated {total / 60:.0f} "
              f"min of wall time on this host (longest point {longest / 60:.1f} min; per point: overhead "
              f"{overhead_s:.1f} s + (arrivals + link backlog) x dilation)")


if __name__ == "__main__":
    main()
