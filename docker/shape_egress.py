"""Shape this container's egress towards one peer with the scenario's scaled link (runs before the agent).

    python3 shape_egress.py --to decode-link -- kvtransit middlebox --link eth-25g --scale 0.001 ...

The scenario is read from the agent's own command line (the flags after `--`), so the shaped rate is the
scaled link the agent itself computes (Scenario.scaled_link: rate x effective scale / dilation). The device
is the one the kernel routes HOST through (`ip route get`), so only the link to that peer is shaped. The tc
argv comes from kvtransit.shaping; tbf works inside containers with NET_ADMIN (measured: 95.8 Mbit/s under a
100mbit tbf between containers). Latency is left to the agents: netem is missing on this kind of kernel, and
the user-space delay line is the middlebox's.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys

from kvtransit.cli.scenario_flags import add_scenario_args, scenario_from_args
from kvtransit.shaping import commands
from kvtransit.shaping.runner import run_command
from kvtransit.shaping.spec import LinkSpec

# kvtransit.shaping builds `tc -n NAMESPACE ...` for the embedded testbed's named namespaces. A container is
# already inside its own namespace and cannot name it (`ip netns attach` needs CAP_SYS_ADMIN), so the
# `-n NAMESPACE` pair is dropped: everything after it is the shaping layer's argv unchanged.
_PLACEHOLDER_NAMESPACE = "container"


def _in_this_namespace(argv: list[str]) -> list[str]:
    assert argv[:3] == ["tc", "-n", _PLACEHOLDER_NAMESPACE], argv
    return ["tc", *argv[3:]]


def route_device(host: str) -> tuple[str, str]:
    """(IPv4 address of host, the interface the kernel sends to it through)."""
    address = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    words = subprocess.run(["ip", "-o", "route", "get", address], capture_output=True, text=True,
                           check=True).stdout.split()
    return address, words[words.index("dev") + 1]


def main(argv: list[str]) -> int:
    if "--" not in argv:
        sys.exit("shape_egress.py: usage: --to HOST -- kvtransit ROLE [scenario flags ...]")
    split = argv.index("--")
    own = argparse.ArgumentParser(prog="shape_egress.py")
    own.add_argument("--to", required=True, metavar="HOST", help="the peer whose traffic crosses the shaped link")
    args = own.parse_args(argv[:split])
    agent_command = argv[split + 1:]
    # allow_abbrev off: the agent's `--decode HOST:PORT` must not be read as `--decode-instances`.
    scenario_parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    add_scenario_args(scenario_parser)
    # The agent's own flags (--listen, --decode ...) are not ours; only the scenario group is read.
    scenario = scenario_from_args(scenario_parser.parse_known_args(agent_command[2:])[0])
    spec = LinkSpec(rate_Bps=scenario.scaled_link.bandwidth_Bps, name=scenario.link)
    address, dev = route_device(args.to)
    for tc in commands.shape_argv(_PLACEHOLDER_NAMESPACE, dev, spec, rate_qdisc="tbf", use_netem=False):
        run_command(_in_this_namespace(tc))
    shown = run_command(["tc", "qdisc", "show", "dev", dev]).strip()
    print(f"kvtransit shaped {dev} (to {args.to} {address}) at {spec.rate_Bps * 8 / 1e6:.3f} Mbit/s goodput: "
          f"{shown}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
