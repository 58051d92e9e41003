"""`kvtransit middlebox --placement switch --ranks N`: the switch that sums a TP group's N streams (flows/tp/switch/),
reached from the core's middlebox command through the registry (its flags: `add_switch_flags` below)."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from typing import Any

from kvtransit.model.errors import ConfigError

SWITCH_GROUP = 1  # the group id a switch serves unless told (flows/tp/run.py's GROUP_ID)


def add_switch_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ranks", type=int, default=None, metavar="N",
                        help="with --placement switch: serve a group of N ranks (kvtransit collective's TP group) as "
                             "the switch that sums their N streams; on a pluggable, refused (it sees one stream)")
    parser.add_argument("--group", type=int, default=SWITCH_GROUP, metavar="ID",
                        help=f"with --ranks: the group id the switch serves (default {SWITCH_GROUP})")
    parser.add_argument("--switch-config", default=None, metavar="JSON",
                        help="with --ranks: the switch's ports and module as kvtransit collective plans them (keys: "
                             "rate_Bps, latency_s, module_ops_per_byte, module_latency_s, module_pj_per_bit, scale, "
                             "deadline_s, collectives, idle_s); default: --link at the run's scale and dilation, the "
                             "--module-* flags")


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


def serve_stream_sum(args: argparse.Namespace, declared: Any, placement: str) -> int:
    """`kvtransit middlebox --placement switch --ranks N`: the switch that sums a group's N streams."""
    from kvtransit.agents.process import parse_address
    from kvtransit.cli._agent import run_agent
    from kvtransit.cli.scenario_flags import scenario_from_args
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
    return run_agent(args, process)
