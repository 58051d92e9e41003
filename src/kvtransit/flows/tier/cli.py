"""`kvtransit kvpool`: the shared KV pool (prefix blocks by content hash, memory LRU over an optional disk tier)."""

from __future__ import annotations

from kvtransit.cli._agent import add_common_agent_flags, run_agent
from kvtransit.cli.scenario_flags import add_scenario_args, scenario_from_args
from kvtransit.flows.tier import cli_prefix_hits as prefix_hits
from kvtransit.flows.tier.section import TierSection


def register(subparsers) -> None:
    """The tier's commands: `kvtransit kvpool` (the pool process) and `kvtransit prefix-hits` (no process)."""
    register_kvpool(subparsers)
    prefix_hits.register(subparsers)


def register_kvpool(subparsers) -> None:
    p = subparsers.add_parser("kvpool", help="run the shared KV pool (prefix reuse)", description=__doc__)
    add_scenario_args(p)
    p.add_argument("--listen", default="127.0.0.1:0", metavar="HOST:PORT",
                   help="where middleboxes connect (default 127.0.0.1:0, any free port)")
    p.add_argument("--capacity", type=float, default=None, metavar="BYTES",
                   help="memory tier capacity, model bytes (default: the scenario's --kv-pool-capacity)")
    p.add_argument("--disk", default=None, metavar="DIR",
                   help="add a disk tier in DIR (write-through, a CRC32C per block file checked on read)")
    p.add_argument("--disk-capacity", type=float, default=0.0, metavar="BYTES",
                   help="disk tier capacity, model bytes (required with --disk)")
    add_common_agent_flags(p, "kvpool")
    p.set_defaults(func=run)


def run(args) -> int:
    from kvtransit.agents.process import parse_address
    from kvtransit.flows.tier.pool.agent import KvPoolAgent

    scenario = scenario_from_args(args)
    agent = KvPoolAgent(scenario, name=args.name, listen=parse_address(args.listen, "--listen"),
                        metrics_listen=parse_address(args.metrics_listen, "--metrics-listen"),
                        capacity_bytes=(TierSection.of(scenario).kv_pool_capacity if args.capacity is None
                                        else args.capacity),
                        disk_dir=args.disk, disk_capacity_bytes=args.disk_capacity)
    return run_agent(args, agent)
