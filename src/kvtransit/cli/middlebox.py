"""`kvtransit middlebox`: the module on a link, at its placement (`--placement`, REFERENCE §5).

    kvtransit middlebox --decode 127.0.0.1:7001                       # pluggable (default): the KV hand-off
    kvtransit middlebox --placement switch --ranks 4 --link nvlink4   # a switch: sums the 4 ranks' streams

A pluggable sees one stream per link: it runs the KV hand-off's codecs, and refuses, at start (`--kernel FILE`,
`--ranks`) and on a live `PUT /kernel`, a kernel that combines streams, with placement_check's reason. A switch
sees many: with `--ranks N` it serves a TP group as the switch that sums their N streams (flows/tp/switch/, the one
implementation; its declared kernel checked by flows/tp/switch/kernel_check.py), counts the streams it merged
(/stats, `switch_merged_streams_total`) and ends with one result line when the group is done. A switch without
`--ranks` carries the KV hand-off as a pluggable does (each hand-off one stream, which a switch sees too).
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import replace

from kvtransit.cli._agent import add_common_agent_flags, run_agent
from kvtransit.cli.scenario_flags import GIVEN, add_scenario_args, scenario_from_args
from kvtransit.model.errors import ConfigError

SWITCH_GROUP = 1  # the group id a switch serves unless told (flows/tp/run.py's GROUP_ID)


def register(subparsers) -> None:
    p = subparsers.add_parser("middlebox", help="run the compute-in-transit module on a link (pluggable or switch)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_scenario_args(p)
    p.add_argument("--listen", default="127.0.0.1:0", metavar="HOST:PORT",
                   help="where prefill instances send KV, or with --ranks where the ranks connect "
                        "(default 127.0.0.1:0, any free port)")
    p.add_argument("--decode", default=None, metavar="HOST:PORT[,HOST:PORT...]",
                   help="decode instances' KV addresses (their --listen); needed for the KV hand-off")
    p.add_argument("--ranks", type=int, default=None, metavar="N",
                   help="with --placement switch: serve a group of N ranks (kvtransit collective's TP group) as the "
                        "switch that sums their N streams; on a pluggable, refused (it sees one stream)")
    p.add_argument("--group", type=int, default=SWITCH_GROUP, metavar="ID",
                   help=f"with --ranks: the group id the switch serves (default {SWITCH_GROUP})")
    p.add_argument("--switch-config", default=None, metavar="JSON",
                   help="with --ranks: the switch's ports and module as kvtransit collective plans them (keys: "
                        "rate_Bps, latency_s, module_ops_per_byte, module_latency_s, module_pj_per_bit, scale, "
                        "deadline_s, collectives, idle_s); default: --link at the run's scale and dilation, the "
                        "--module-* flags")
    p.add_argument("--control-listen", default="127.0.0.1:0", metavar="HOST:PORT",
                   help="the live control API (default 127.0.0.1:0; loopback unless you expose it)")
    p.add_argument("--control-token-env", default="KVTRANSIT_CONTROL_TOKEN", metavar="VAR",
                   help="environment variable holding a bearer token the control API requires, if set "
                        "(default KVTRANSIT_CONTROL_TOKEN)")
    p.add_argument("--link-backend", choices=("userspace", "tc"), default="userspace",
                   help="what shapes the link's rate: our token bucket (default), or tc on this process's "
                        "egress interface (the launcher's network namespaces, compose); the delay line and the "
                        "module's hold stay here either way")
    p.add_argument("--kvpool", default=None, metavar="HOST:PORT",
                   help="the KV pool behind this middlebox (kvtransit kvpool): prefills fetch and write back "
                        "prefix blocks through --pool-listen, over the module and the link")
    p.add_argument("--decode-remote-kv", default=None, metavar="HOST:PORT[,HOST:PORT...]",
                   help="--kv-placement remote: each decode's remote-KV port (its legs to the pool cross the link "
                        "through us)")
    p.add_argument("--kvpool-remote-kv", default=None, metavar="HOST:PORT",
                   help="--kv-placement remote: the KV pool's remote-KV port")
    p.add_argument("--pool-listen", default="127.0.0.1:0", metavar="HOST:PORT",
                   help="with --kvpool: where prefills reach the pool (default 127.0.0.1:0, any free port)")
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
    if args.ranks is not None or (declared is not None and declared.streams > 1):
        return _run_switch(args, declared, placement)
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
        kvpool=parse_address(args.kvpool, "--kvpool") if args.kvpool else None,
        pool_listen=parse_address(args.pool_listen, "--pool-listen"),
        decode_remote_kv=(parse_addresses(args.decode_remote_kv, "--decode-remote-kv") if args.decode_remote_kv
                          else None),
        kvpool_remote_kv=(parse_address(args.kvpool_remote_kv, "--kvpool-remote-kv") if args.kvpool_remote_kv
                          else None))
    return run_agent(args, lambda: process.run)


def _switch_config_text(text: str | None) -> dict:
    if text is None:
        return {}
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--switch-config: not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--switch-config: expected a JSON object, got {type(data).__name__}")
    return data


def _run_switch(args: argparse.Namespace, declared, placement: str) -> int:
    from kvtransit.agents.process import parse_address
    from kvtransit.flows.tp.switch.kernel_check import check_switch_kernel, placement_refusal
    from kvtransit.flows.tp.switch.process import SwitchConfig, SwitchProcess
    from kvtransit.kernels.stream_sum import declaration as sum_declaration

    where = f"--kernel {args.kernel_declaration_file}: " if declared is not None else ""
    size = args.ranks if args.ranks is not None else declared.streams
    if size < 2:
        raise ConfigError(f"--ranks: a switch sums at least 2 ranks' streams, got {size}")
    decl = declared if declared is not None else sum_declaration(size)
    refusal = placement_refusal(decl, placement)  # first: a pluggable is refused whatever else is wrong
    if refusal is not None:
        raise ConfigError(f"{where}{refusal} (this middlebox's --placement is {placement})")
    if args.decode:
        raise ConfigError("--decode: a switch serving a TP group (--ranks, or a kernel that combines streams) has no "
                          "decode peers; drop --decode, or --ranks for the KV hand-off")
    # The scenario gives the defaults (its link at its scale and dilation, its module); the kernel file is checked
    # here, not mapped onto the hand-off's codec fields (a sum is no KV codec: model/module/kernel_runs.py refuses it).
    scenario = scenario_from_args(argparse.Namespace(**{**vars(args), "kernel_declaration_file": None}))
    port = scenario.scaled_link
    defaults = {"group": args.group, "size": size, "rate_Bps": port.bandwidth_Bps, "latency_s": port.latency_s,
                "module_ops_per_byte": scenario.module.ops_per_byte,
                "module_latency_s": scenario.module.added_latency_s * scenario.effective_dilation,
                "module_pj_per_bit": scenario.module.pj_per_input_bit, "scale": scenario.effective_scale}
    config = SwitchConfig.from_mapping(_switch_config_text(args.switch_config), defaults)
    if config.size != size:
        raise ConfigError(f"--switch-config: size {config.size} contradicts --ranks {size}: drop one")
    try:
        check_switch_kernel(decl, size, placement, config.module)
    except ConfigError as exc:
        raise ConfigError(f"{where}{exc}") from None
    process = SwitchProcess(config, replace(decl, placement=placement), name=args.name,
                            listen=parse_address(args.listen, "--listen"),
                            metrics_listen=parse_address(args.metrics_listen, "--metrics-listen"))
    return run_agent(args, lambda: process.run)
