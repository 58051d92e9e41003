"""`kvtransit prefill`: one prefill instance (queue, batch, hold the roofline step, stream the KV)."""

from __future__ import annotations

from kvtransit.cli._agent import add_common_agent_flags, flow_args, run_agent
from kvtransit.cli.scenario_flags import add_scenario_args, scenario_from_args


def register(subparsers) -> None:
    from kvtransit.agents.plugins import add_flow_flags

    p = subparsers.add_parser("prefill", help="run one prefill instance", description=__doc__)
    add_scenario_args(p)
    p.add_argument("--listen", default="127.0.0.1:0", metavar="HOST:PORT",
                   help="where load generators connect (default 127.0.0.1:0, any free port)")
    p.add_argument("--kv-to", required=True, metavar="HOST:PORT", help="the middlebox that carries the KV to decode")
    add_flow_flags(p, "prefill")
    add_common_agent_flags(p, "prefill")
    p.set_defaults(func=run)


def run(args) -> int:
    from kvtransit.agents.prefill.agent import PrefillAgent
    from kvtransit.agents.process import parse_address

    agent = PrefillAgent(scenario_from_args(args), name=args.name, listen=parse_address(args.listen, "--listen"),
                         kv_to=parse_address(args.kv_to, "--kv-to"),
                         metrics_listen=parse_address(args.metrics_listen, "--metrics-listen"),
                         flow_args=flow_args(args))
    return run_agent(args, agent)
