"""Start-up: what each process of a run spends importing before it can serve, and what ml_dtypes' release costs.

    python benchmarks/startup.py [--repeat 5] [--ml-dtypes 0.6.0 0.7.0]

Every live run starts its agents as processes (a loadgen, prefills, a middlebox, decodes, the flows' own), and each
imports the package before its readiness line: on a 2-core box that start is a large share of a short run's
wall and CPU. Per role, the wall of `python -m kvtransit.cli <role> --help` in a fresh interpreter (it imports what
the role's run imports, then exits; median of `--repeat`), and the heaviest top-level packages' import time from
`python -X importtime`.

`--ml-dtypes V ...` installs each named release of ml_dtypes into a temporary folder (`pip install --target`, from
the package registry) and times `import ml_dtypes` beside numpy under each, in this same run, as ratios to the
first: the measurement behind pyproject.toml's `ml_dtypes<0.7`.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROLES = ("loadgen", "prefill", "middlebox", "decode", "up")


def _wall_s(role: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "kvtransit.cli", role, "--help"], check=True, capture_output=True)
    return time.perf_counter() - start


def _by_package(role: str) -> list[tuple[str, float]]:
    """Self import time summed per top-level package (kvtransit split one level down), heaviest first, seconds."""
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "kvtransit.cli", role, "--help"], check=True,
                         capture_output=True, text=True).stderr
    totals: collections.Counter[str] = collections.Counter()
    for line in out.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, _, name = line[len("import time:"):].split("|")
        parts = name.strip().split(".")
        totals[".".join(parts[:2]) if parts[0] == "kvtransit" else parts[0]] += int(self_us)
    return [(name, us / 1e6) for name, us in totals.most_common(4)]


def roles(repeat: int) -> None:
    print("| role | `kvtransit <role> --help` wall, median (s) | heaviest packages (self import s) |")
    print("|---|---:|---|")
    for role in ROLES:
        wall = statistics.median(_wall_s(role) for _ in range(repeat))
        heavy = ", ".join(f"{name} {s:.2f}" for name, s in _by_package(role))
        print(f"| {role} | {wall:.2f} | {heavy} |")


def ml_dtypes_releases(versions: list[str], repeat: int) -> None:
    code = ("import time, numpy; t = time.perf_counter(); import ml_dtypes; "
            "print(time.perf_counter() - t)")
    rows = []
    with tempfile.TemporaryDirectory(prefix="kvtransit-ml-dtypes-") as root:
        for version in versions:
            target = os.path.join(root, version)
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", target,
                            f"ml_dtypes=={version}"], check=True)
            env = {**os.environ, "PYTHONPATH": target}
            times = [float(subprocess.run([sys.executable, "-c", code], check=True, env=env, capture_output=True,
                                          text=True).stdout) for _ in range(repeat)]
            rows.append((version, statistics.median(times)))
    print("\n| ml_dtypes | `import ml_dtypes` after numpy, median (ms) | / first |")
    print("|---|---:|---:|")
    for version, s in rows:
        print(f"| {version} | {s * 1e3:.1f} | {s / rows[0][1]:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--ml-dtypes", nargs="*", default=[], metavar="VERSION")
    args = parser.parse_args()
    roles(args.repeat)
    if args.ml_dtypes:
        ml_dtypes_releases(args.ml_dtypes, args.repeat)


if __name__ == "__main__":
    main()
