"""Timer wake-ups: the loop's own timer + a 1 ms yield-spin vs a timerfd + a short spin (runtime/clock.py), and the
default timerfd with real-time priority for the wake-up (runtime/wakeup_priority.py; skipped where not allowed).

    python benchmarks/clock.py [--sleeps 300] [--step-ms 5] [--procs 1 4] [--busy 0 1]

Every case runs MonotonicClock.sleep_until on absolute deadlines `--step-ms` apart (a decode step's shape), on
uvloop, in `procs` processes at once (the agents of one run share the box) beside `busy` processes that spin on
a core (other work on the box). Prints, per case, the wake-up lateness (p50, p90, p99, max, µs) and the CPU the
sleeper used (share of a core), and the ratio of each timer's figures to the loop timer's in the same case.
Tail lateness is what moves a hand-off (a late middlebox release is link time lost for good) and CPU is what
the other agents lose; both are measured side by side here, in one run.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time

from kvtransit.runtime import wakeup_priority
from kvtransit.runtime.clock import MonotonicClock
from kvtransit.runtime.loop import run

# name -> (use_timerfd, spin_s, real-time wake-ups); the first is the baseline the ratios divide by.
TIMERS = {"loop + 1 ms spin": (False, 1e-3, False), "timerfd + 500 µs": (True, 500e-6, False),
          "timerfd + 500 µs + RT (default)": (True, 500e-6, True),
          "timerfd + 200 µs spin": (True, 200e-6, False), "timerfd + 50 µs spin": (True, 50e-6, False)}


def _sleeper(timer: tuple[bool, float, bool], sleeps: int, step_s: float, out) -> None:
    use_timerfd, spin_s, realtime = timer
    clock = MonotonicClock(use_timerfd=use_timerfd, spin_s=spin_s,
                           wakeup_priority=wakeup_priority.probe() if realtime else None)
    late: list[float] = []

    async def main() -> None:
        deadline = clock.now_ns()
        for _ in range(sleeps):
            deadline += round(step_s * 1e9)
            late.append(await clock.sleep_until(deadline) / 1e3)

    wall0, cpu0 = time.monotonic(), time.process_time()
    run(main(), loop="uvloop")
    out.put((late, (time.process_time() - cpu0) / (time.monotonic() - wall0)))


def _busy(stop) -> None:
    while not stop.is_set():
        pass


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1)))]


def measure(timer: tuple[bool, float, bool], *, procs: int, busy: int, sleeps: int, step_s: float) -> dict[str, float]:
    ctx = multiprocessing.get_context("fork")
    stop, out = ctx.Event(), ctx.Queue()
    hogs = [ctx.Process(target=_busy, args=(stop,)) for _ in range(busy)]
    sleepers = [ctx.Process(target=_sleeper, args=(timer, sleeps, step_s, out)) for _ in range(procs)]
    for p in hogs + sleepers:
        p.start()
    results = [out.get() for _ in sleepers]
    stop.set()
    for p in hogs + sleepers:
        p.join()
    late = [x for lateness, _ in results for x in lateness]
    return {"mean": statistics.mean(late), "p50": _quantile(late, 0.5), "p90": _quantile(late, 0.9),
            "p99": _quantile(late, 0.99), "max": max(late), "cpu": statistics.mean(cpu for _, cpu in results)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sleeps", type=int, default=300)
    parser.add_argument("--step-ms", type=float, default=5.0)
    parser.add_argument("--procs", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--busy", type=int, nargs="+", default=[0, 1])
    args = parser.parse_args()
    timers = dict(TIMERS)
    if not (realtime := wakeup_priority.probe()).available:
        print(f"real-time wake-ups skipped: {realtime.describe()}")
        timers = {name: timer for name, timer in timers.items() if not timer[2]}
    print(f"{'case':<24}{'timer':<32}{'mean µs':>9}{'p50 µs':>9}{'p90 µs':>9}{'p99 µs':>9}{'max µs':>9}{'CPU':>7}"
          f"{'mean / loop':>12}{'CPU / loop':>12}")
    for procs in args.procs:
        for busy in args.busy:
            case = f"{procs} sleeper(s), {busy} busy"
            base: dict[str, float] | None = None
            for name, timer in timers.items():
                got = measure(timer, procs=procs, busy=busy, sleeps=args.sleeps, step_s=args.step_ms / 1e3)
                base = base or got
                print(f"{case:<24}{name:<32}{got['mean']:>9.1f}{got['p50']:>9.1f}{got['p90']:>9.1f}{got['p99']:>9.1f}"
                      f"{got['max']:>9.1f}{got['cpu']:>7.0%}{got['mean'] / base['mean']:>12.2f}"
                      f"{got['cpu'] / base['cpu']:>12.2f}")


if __name__ == "__main__":
    main()
