"""`kvtransit prefill`: one prefill instance (queue, batch, hold the roofline step, stream the KV)."""

from __future__ import annotations

from kvtransit.cli._agent import add_common_agent_flags, run_agent
from kvtransit.cli.scenario_flags import add_scenario_args, scenario_from_args
from kvtransit.flows.tp.cli_group_flags import (
    add_ring_group_flag,
    add_tp_group_flag,
    ring_group_config,
    tp_group_config,
)


def register(subparsers) -> None:
    p = subparsers.add_parser("prefill", help="run one prefill instance", description=__doc__)
    add_scenario_args(p)
    p.add_argument("--listen", default="127.0.0.1:0", metavar="HOST:PORT",
                   help="where load generators connect (default 127.0.0.1:0, any free port)")
    p.add_argument("--kv-to", required=True, metavar="HOST:PORT", help="the middlebox that carries the KV to decode")
    p.add_argument("--kv-pool-via", default=None, metavar="HOST:PORT",
                   help="with --kv-pool pool: the middlebox's pool port (its --pool-listen), the way to the KV pool")
    add_tp_group_flag(p, "prefill")
    add_ring_group_flag(p)
    add_common_agent_flags(p, "prefill")
    p.set_defaults(func=run)


def run(args) -> int:
    from kvtransit.agents.prefill.agent import PrefillAgent
    from kvtransit.agents.process import parse_address

    scenario = scenario_from_args(args)
    agent = PrefillAgent(scenario, name=args.name, listen=parse_address(args.listen, "--listen"),
                         kv_to=parse_address(args.kv_to, "--kv-to"),
                         metrics_listen=parse_address(args.metrics_listen, "--metrics-listen"),
                         pool_via=parse_address(args.kv_pool_via, "--kv-pool-via") if args.kv_pool_via else None,
                         tp_group=tp_group_config(args.tp_group, "--prefill-tp", scenario.prefill_tp),
                         ring_group=ring_group_config(args.ring_group, scenario.ring_share))
    return run_agent(args, lambda: agent.run)
