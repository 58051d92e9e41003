"""How much this host can emulate at full speed: per codec, the highest request rate and the largest scale whose
run is still faithful at dilation 1, found by bisection over real runs.

    python benchmarks/capacity.py [--codecs freq-keep-k none] [--scale 0.0625] [--rates 4 16]
                                  [--rate-steps 3] [--scale-rate 8] [--scales 0.015625 0.03125 0.0625 0.125]
                                  [--requests 400] [--links auto] [--out DIR]

Every probe is one `kvtransit up` run (the Launcher, placed as `--links auto` places it: namespaces + tc when
root) of the deck's 25 GbE study point: llama3-8b on an h100 per instance, eth-25g, prompts 2,048 tokens and
outputs 256 (both cv 0.5), seed 1, the codec in transit, dilation 1. A probe records what its own report
measured (faithful or the checks that failed, the timer lateness per role, the share of its rate the link
reached while busy, the kernel's time against the model) and, per agent, the CPU it used over the run (user +
system from /proc/PID/stat, sampled until it exits, over its lifetime).

Two searches per codec:
- the highest faithful rate at `--scale`: bisection on the rate in [lo, hi] (`--rate-steps` halvings after
  probing both ends);
- the largest faithful scale at `--scale-rate`: bisection on the ladder `--scales` (each step a doubling of the
  bytes a request carries).
Faithfulness on this 2-core box moves with whatever else runs: keep the machine quiet while it runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kvtransit.harness.up.launcher import Launcher
from kvtransit.model.scenario import Scenario

STUDY = dict(model="llama3-8b", device="h100", link="eth-25g", compress_at="transit", prompt_mean=2048.0,
             prompt_cv=0.5, output_mean=256.0, output_cv=0.5, seed=1, dilation=1.0)
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process (/proc/PID/stat fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


@dataclass
class CpuSampler:
    """Each process's CPU seconds and lifetime, sampled every `interval_s` until stopped (by name)."""

    processes: Callable[[], dict[str, int]]
    interval_s: float = 0.25
    seen: dict[str, tuple[float, float, float]] = field(default_factory=dict)  # name → (first t, last t, cpu s)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            now = time.monotonic()
            for name, pid in self.processes().items():
                with contextlib.suppress(OSError, IndexError, ValueError):  # exited: its last sample stands
                    used = cpu_s(pid)
                    first = self.seen.get(name, (now, now, 0.0))[0]
                    self.seen[name] = (first, now, used)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval_s):
                    await stop.wait()

    def shares(self) -> dict[str, float]:
        """Per process, the share of one core it used over its sampled lifetime."""
        return {name: used / (last - first) for name, (first, last, used) in self.seen.items() if last > first}


@dataclass
class Probe:
    codec: str
    rate: float
    scale: float
    faithful: bool
    failing: dict[str, str]
    timer_late: dict[str, float]  # role → mean lateness as a share of its shortest step
    link_reached: float | None  # share of the configured rate while busy (None: not measured)
    kernel_over_model: float | None
    slo_attainment: float
    cpu: dict[str, float]
    wall_s: float


def probe(workdir: Path, codec: str, rate: float, scale: float, requests: int, links: str) -> Probe:
    scenario = Scenario.build(codec=codec, rate=rate, scale=scale, requests=requests, **STUDY)
    report_path = workdir / f"{codec}-{rate:g}-{scale:g}.json"
    launcher = Launcher(scenario, report_path=report_path, accuracy_sample=0, links=links, log=lambda _msg: None)
    sampler = CpuSampler(lambda: {c.name: c.pid for c in launcher.children if c.pid is not None})

    async def run() -> None:
        stop = asyncio.Event()
        sampling = asyncio.create_task(sampler.run(stop))
        try:
            await launcher.run()
        finally:
            stop.set()
            await sampling

    started = time.monotonic()
    asyncio.run(run())
    wall_s = time.monotonic() - started
    report = json.loads(report_path.read_text())
    fidelity = report["fidelity"]
    link = fidelity.get("link_rate", {})
    kernel = fidelity.get("kernel_time", {})
    return Probe(
        codec=codec, rate=rate, scale=scale, faithful=report["faithful"],
        failing={name: check["hint"] for name, check in fidelity.items() if not check["ok"]},
        timer_late={name.removeprefix("timer_"): check["measured"] for name, check in fidelity.items()
                    if name.startswith("timer_")},
        # link_rate's `measured` is the shortfall while busy (0 = the configured rate was reached).
        link_reached=None if not link or "not measured" in link.get("hint", "") else 1 - link["measured"],
        kernel_over_model=(kernel["measured"] if codec != "none" and kernel and "not measured" not in kernel["hint"]
                           else None),
        slo_attainment=report["slo_attainment"], cpu=sampler.shares(), wall_s=wall_s)


def highest_rate(run: Callable[[float], Probe], lo: float, hi: float, steps: int) -> tuple[float | None, list[Probe]]:
    """The highest faithful rate in [lo, hi] to within (hi − lo) / 2**steps: None when `lo` is not faithful."""
    probes = [run(lo)]
    if not probes[-1].faithful:
        return None, probes
    probes.append(run(hi))
    if probes[-1].faithful:
        return hi, probes
    good, bad = lo, hi
    for _ in range(steps):
        mid = round((good + bad) / 2, 3)
        probes.append(run(mid))
        good, bad = (mid, bad) if probes[-1].faithful else (good, mid)
    return good, probes


def largest_scale(run: Callable[[float], Probe], ladder: list[float]) -> tuple[float | None, list[Probe]]:
    """The largest faithful scale of an ascending ladder, by bisection (faithfulness falls as bytes grow)."""
    probes: list[Probe] = []
    good, bad = -1, len(ladder)  # indexes: good is faithful (or none yet), bad is not (or past the end)
    while bad - good > 1:
        mid = (good + bad) // 2
        probes.append(run(ladder[mid]))
        good, bad = (mid, bad) if probes[-1].faithful else (good, mid)
    return (ladder[good] if good >= 0 else None), probes


def row(p: Probe) -> str:
    late = ", ".join(f"{role} {share:.1%}" for role, share in sorted(p.timer_late.items()))
    cpu = ", ".join(f"{name.split('-')[0]} {share:.0%}" for name, share in sorted(p.cpu.items()))
    link = "-" if p.link_reached is None else f"{p.link_reached:.0%}"
    kernel = "-" if p.kernel_over_model is None else f"{p.kernel_over_model:.2f}x"
    why = "" if p.faithful else "; ".join(p.failing)
    return (f"| {p.codec} | {p.rate:g} | 1/{1 / p.scale:g} | {'yes' if p.faithful else 'no: ' + why} | {late} | "
            f"{link} | {kernel} | {p.slo_attainment:.1%} | {cpu} | {p.wall_s:.0f} |")


HEADER = ("| codec | req/s | scale | faithful | timer lateness (share of a step) | link rate reached | "
          "kernel / model | SLO | CPU per agent (share of a core) | wall s |\n|" + "---|" * 10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--codecs", nargs="+", default=["freq-keep-k", "none"])
    parser.add_argument("--scale", type=float, default=1 / 16, help="scale of the rate search (default 1/16)")
    parser.add_argument("--rates", nargs=2, type=float, default=[4.0, 16.0], metavar=("LO", "HI"))
    parser.add_argument("--rate-steps", type=int, default=3)
    parser.add_argument("--scale-rate", type=float, default=8.0, help="rate of the scale search (default 8)")
    parser.add_argument("--scales", nargs="+", type=float, default=[1 / 64, 1 / 32, 1 / 16, 1 / 8])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--links", default="auto", choices=["auto", "netns", "loopback"])
    parser.add_argument("--out", type=Path, default=None, help="keep the probes' reports here")
    args = parser.parse_args()
    workdir = args.out or Path(tempfile.mkdtemp(prefix="kvtransit-capacity-"))
    workdir.mkdir(parents=True, exist_ok=True)
    summary = []
    print(HEADER, flush=True)
    for codec in args.codecs:
        def at_rate(rate: float, codec: str = codec) -> Probe:
            p = probe(workdir, codec, rate, args.scale, args.requests, args.links)
            print(row(p), flush=True)
            return p

        def at_scale(scale: float, codec: str = codec) -> Probe:
            p = probe(workdir, codec, args.scale_rate, scale, args.requests, args.links)
            print(row(p), flush=True)
            return p

        rate, _ = highest_rate(at_rate, args.rates[0], args.rates[1], args.rate_steps)
        scale, _ = largest_scale(at_scale, sorted(args.scales))
        summary.append((codec, rate, scale))
    print(f"\nhighest faithful rate at scale 1/{1 / args.scale:g} and largest faithful scale at "
          f"{args.scale_rate:g} req/s (dilation 1, {args.requests} requests a probe, links {args.links}):")
    for codec, rate, scale in summary:
        print(f"  {codec}: rate {'none faithful' if rate is None else f'{rate:g} req/s'}; "
              f"scale {'none faithful' if scale is None else f'1/{1 / scale:g}'}")
    print(f"reports: {workdir}")


if __name__ == "__main__":
    main()
