"""`kvtransit decode`: one decode instance (reassemble KV, continuous batching, stream tokens)."""

from __future__ import annotations

from kvtransit.cli._agent import add_common_agent_flags, flow_args, run_agent
from kvtransit.cli.scenario_flags import add_scenario_args, scenario_from_args


def register(subparsers) -> None:
    from kvtransit.agents.plugins import add_flow_flags

    p = subparsers.add_parser("decode", help="run one decode instance", description=__doc__)
    add_scenario_args(p)
    p.add_argument("--listen", default="127.0.0.1:0", metavar="HOST:PORT",
                   help="where the middlebox delivers KV (default 127.0.0.1:0, any free port)")
    p.add_argument("--client-listen", default="127.0.0.1:0", metavar="HOST:PORT",
                   help="where load generators connect for tokens (default 127.0.0.1:0)")
    p.add_argument("--accuracy-sample", type=int, default=8, metavar="N",
                   help="invert the codec on the first N requests and measure its error (default 8)")
    p.add_argument("--link-backend", choices=("userspace", "tc"), default="userspace",
                   help="what shapes the link's rate (as the middlebox's flag): with tc, this end's receive-side "
                        "measurement is exported as the link's achieved rate")
    add_flow_flags(p, "decode")
    add_common_agent_flags(p, "decode")
    p.set_defaults(func=run)


def run(args) -> int:
    from kvtransit.agents.decode.agent import DecodeAgent
    from kvtransit.agents.process import parse_address
    from kvtransit.cli._common import CliError

    if args.accuracy_sample < 0:
        raise CliError(f"--accuracy-sample must be >= 0, got {args.accuracy_sample}")
    agent = DecodeAgent(scenario_from_args(args), name=args.name, listen=parse_address(args.listen, "--listen"),
                        client_listen=parse_address(args.client_listen, "--client-listen"),
                        metrics_listen=parse_address(args.metrics_listen, "--metrics-listen"),
                        accuracy_sample=args.accuracy_sample, link_backend=args.link_backend,
                        flow_args=flow_args(args))
    return run_agent(args, agent)
