"""`kvtransit middlebox`: the module on a link, at its placement (`--placement`, docs/reference.md §5).

    kvtransit middlebox --decode 127.0.0.1:7001                       # pluggable (default): the KV hand-off
    kvtransit middlebox --placement switch --ranks 4 --link nvlink4   # a switch: sums the 4 ranks' streams

A pluggable sees one stream per link: it runs the KV hand-off's codecs, and refuses, at start (`--kernel FILE`,
`--ranks`) and on a live `PUT /kernel`, a kernel that combines streams, with placement_check's reason. A switch
sees many: with `--ranks N` (or a declared kernel of several streams) it serves a group of ranks as the switch that
sums their N streams, which is the tp flow's (flows/tp/switch/: the one implementation, its flags and its checks;
reached through the registry). A switch without `--ranks` carries the KV hand-off as a pluggable does (each
hand-off one stream, which a switch sees too).
"""

from __future__ import annotations

import argparse
import os

from kvtransit import flows
from kvtransit.cli._agent import add_common_agent_flags, flow_args, run_agent
from kvtransit.cli.scenario_flags import GIVEN, add_scenario_args, scenario_from_args
from kvtransit.model.errors import ConfigError


def register(subparsers) -> None:
    from kvtransit.agents.plugins import add_flow_flags
    p = subparsers.add_parser("middlebox", help="run the compute-in-transit module on a link (pluggable or switch)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_scenario_args(p)
    p.add_argument("--listen", default="127.0.0.1:0", metavar="HOST:PORT",
                   help="where prefill instances send KV, or with --ranks where the ranks connect "
                        "(default 127.0.0.1:0, any free port)")
    p.add_argument("--decode", default=None, metavar="HOST:PORT[,HOST:PORT...]",
                   help="decode instances' KV addresses (their --listen); needed for the KV hand-off")
    p.add_argument("--control-listen", default="127.0.0.1:0", metavar="HOST:PORT",
                   help="the live control API (default 127.0.0.1:0; loopback unless you expose it)")
    p.add_argument("--control-token-env", default="KVTRANSIT_CONTROL_TOKEN", metavar="VAR",
                   help="environment variable holding a bearer token the control API requires, if set "
                        "(default KVTRANSIT_CONTROL_TOKEN)")
    p.add_argument("--link-backend", choices=("userspace", "tc"), default="userspace",
                   help="what shapes the link's rate: our token bucket (default), or tc on this process's "
                        "egress interface (the launcher's network namespaces, compose); the delay line and the "
                        "module's hold stay here either way")
    add_flow_flags(p, "middlebox")  # the tier's pool port, selection's remote-KV relay
    for stream_sum in _stream_sums():  # the tp flow's switch: --ranks, --group, --switch-config
        stream_sum["add_flags"](p)
    add_common_agent_flags(p, "middlebox")
    p.set_defaults(func=run)


def _declared_kernel(args: argparse.Namespace):
    """The `--kernel FILE` declaration, or None."""
    from kvtransit.model.module.kernel_file import load_kernel_declaration

    path = getattr(args, "kernel_declaration_file", None)
    return load_kernel_declaration(path) if path else None  # its errors already name the file


def process_placement(args: argparse.Namespace, declared) -> str:
    """The process's placement: `--placement` when given, else the kernel file's (as `--kernel` sets the flags it
    states), else the scenario's default (pluggable)."""
    if "placement" in getattr(args, GIVEN, frozenset()) or declared is None:
        return str(args.scenario_placement)
    return str(declared.placement)


def run(args: argparse.Namespace) -> int:
    declared = _declared_kernel(args)
    placement = process_placement(args, declared)
    if getattr(args, "ranks", None) is not None or (declared is not None and declared.streams > 1):
        sums = _stream_sums()
        if not sums:
            raise ConfigError("--ranks: no flow serves a switch that sums streams (the tp flow does)")
        return int(sums[0]["serve"](args, declared, placement))
    return _run_handoff(args)  # a kernel of one stream: any placement sees it


def _run_handoff(args: argparse.Namespace) -> int:
    from kvtransit.agents.middlebox.process import MiddleboxProcess
    from kvtransit.agents.process import parse_address, parse_addresses

    if not args.decode:
        raise ConfigError("--decode: the KV hand-off needs the decode instances' addresses (HOST:PORT[,...]); "
                          "a switch serving a TP group takes --placement switch --ranks N instead")
    process = MiddleboxProcess(
        scenario_from_args(args), name=args.name, listen=parse_address(args.listen, "--listen"),
        decodes=parse_addresses(args.decode, "--decode"),
        metrics_listen=parse_address(args.metrics_listen, "--metrics-listen"),
        control_listen=parse_address(args.control_listen, "--control-listen"),
        control_token=os.environ.get(args.control_token_env) or None, link_backend=args.link_backend,
        flow_args=flow_args(args))
    return run_agent(args, process)


def _stream_sums() -> list[dict]:
    """The flows that serve a switch summing a group's streams (a flow's cli.py: STREAM_SUM), through the registry."""
    return [stream_sum for _, stream_sum in flows.attribute("cli", "STREAM_SUM")]
