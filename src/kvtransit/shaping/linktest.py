"""Build a throw-away namespace pair with one spec, measure it, remove everything: configured vs achieved.

Goodput: a TCP bulk transfer (measure.py sink/bulk) across the shaped veth, measured at the receiver after a
warm-up. Added latency: median ping-pong RTT through the delay minus the median RTT of the same path without
it (for the user-space delay, a second relay with zero latency, so the relay hop itself, which the middlebox's
in-process shaper does not have, is not counted; for netem, which delays everything on the veth, the far
namespace's loopback).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from kvtransit.shaping.backend import Capabilities, plan, probe
from kvtransit.shaping.errors import ShapingError
from kvtransit.shaping.runner import Runner, run_command
from kvtransit.shaping.spec import LinkSpec
from kvtransit.shaping.topology import LinkPlan, build_testbed

# Inside our own fresh namespaces: nothing else listens.
SINK_PORT, ECHO_PORT, RELAY_PORT, ZERO_RELAY_PORT = 5201, 5202, 5203, 5204
READY_TIMEOUT_S = 10.0
DEFAULT_WARMUP_S = 0.5  # slow start and the bucket's initial burst are over well within this at >= 10 Mbit/s


class _Process:
    """One measurement process inside a namespace; killed by its own pid on exit."""

    def __init__(self, argv: list[str]) -> None:
        self.argv = argv
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None and self.proc.stderr is not None  # both are pipes
        self.stdout, self.stderr = self.proc.stdout, self.proc.stderr

    def line(self) -> dict[str, Any]:
        text = self.stdout.readline()
        if not text:
            self.proc.wait(timeout=READY_TIMEOUT_S)
            raise ShapingError("measurement", " ".join(self.argv), f"exited: {self.stderr.read().strip()}")
        result: dict[str, Any] = json.loads(text)
        return result

    def finish(self, timeout: float) -> dict[str, Any]:
        """Wait for the process to exit (bounded: a peer that never connects must not hang the run), then read
        its one result line (small enough to sit in the pipe meanwhile)."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise ShapingError("measurement", " ".join(self.argv), f"did not finish within {timeout:g} s") from None
        return self.line()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.stdout.close()
        self.stderr.close()


def _python_in(namespace: str, module: str, *args: object) -> list[str]:
    return ["ip", "netns", "exec", namespace, sys.executable, "-m", f"kvtransit.shaping.{module}", *map(str, args)]


def run_link_test(spec: LinkSpec, *, seconds: float = 3.0, rtt_count: int = 200, warmup_s: float = DEFAULT_WARMUP_S,
                  runner: Runner = run_command, capabilities: Capabilities | None = None) -> dict[str, Any]:
    """Measure `spec` on a fresh namespace pair. Raises ShapingError before creating anything if the spec
    cannot be realised here. Returns configured vs achieved, and which back-end did each property."""
    caps = capabilities if capabilities is not None else probe(runner)
    link_plan = plan(spec, caps)
    manifest_dir = tempfile.mkdtemp(prefix="kvtransit-links-")
    manifest_path = Path(manifest_dir) / "manifest.json"
    result: dict[str, Any] = {
        "configured_bps": spec.rate_Bps * 8 if spec.rate_Bps else None, "achieved_bps": None,
        "configured_latency_s": spec.latency_s if spec.has_delay else None, "achieved_latency_s": None,
        "backends": link_plan.describe(),
        "backend": "+".join(sorted({b for b in link_plan.describe().values() if b})) or "none",
    }
    with ExitStack() as stack:
        stack.callback(os.rmdir, manifest_dir)
        stack.callback(manifest_path.unlink, missing_ok=True)
        bed = build_testbed(["src", "dst"], [LinkPlan("src", "dst", spec)], runner=runner, capabilities=caps,
                            manifest_path=manifest_path)
        stack.callback(bed.cleanup)

        def start(argv: list[str]) -> _Process:
            process = _Process(argv)
            stack.callback(process.close)
            return process

        src, dst = bed.namespace("src"), bed.namespace("dst")
        assert src is not None and dst is not None  # only the agent "host" is the root namespace
        dst_addr = bed.address("dst", "src")
        delay_port = ECHO_PORT
        if link_plan.needs_userspace_delay:
            relay = start(_python_in(dst, "relay", dst_addr, RELAY_PORT, "127.0.0.1", ECHO_PORT, "--latency",
                                     spec.latency_s, "--jitter", spec.jitter_s, "--distribution", spec.distribution))
            relay.line()
            delay_port = RELAY_PORT

        if spec.rate_Bps is not None:
            sink = start(_python_in(dst, "measure", "sink", "0.0.0.0", SINK_PORT, "--warmup", warmup_s))
            sink.line()
            start(_python_in(src, "measure", "bulk", dst_addr, SINK_PORT, "--seconds", seconds + warmup_s))
            got = sink.finish(timeout=seconds * 4 + 10)
            result["achieved_bps"] = got["goodput_Bps"] * 8
            result["goodput_bytes"] = got["bytes"]

        if spec.has_delay:
            echo = start(_python_in(dst, "measure", "echo", "0.0.0.0", ECHO_PORT))
            echo.line()
            delayed = start(_python_in(src, "measure", "rtt", dst_addr, delay_port, "--count", rtt_count))
            shaped_rtt = delayed.finish(timeout=rtt_count * (spec.latency_s + spec.jitter_s + 0.05) + 10)["median_s"]
            echo.close()
            echo = start(_python_in(dst, "measure", "echo", "0.0.0.0", ECHO_PORT))
            echo.line()
            if link_plan.needs_userspace_delay:  # same veth, same relay hop, no delay
                zero = start(_python_in(dst, "relay", dst_addr, ZERO_RELAY_PORT, "127.0.0.1", ECHO_PORT,
                                        "--latency", 0))
                zero.line()
                baseline = start(_python_in(src, "measure", "rtt", dst_addr, ZERO_RELAY_PORT, "--count", rtt_count))
            else:  # netem delays the whole veth: the far side's loopback is the undelayed reference
                baseline = start(_python_in(dst, "measure", "rtt", "127.0.0.1", ECHO_PORT, "--count", rtt_count))
            base_rtt = baseline.finish(timeout=30)["median_s"]
            result["achieved_latency_s"] = shaped_rtt - base_rtt
            result["rtt_shaped_s"], result["rtt_baseline_s"] = shaped_rtt, base_rtt
    return result
