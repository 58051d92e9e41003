"""`kvtransit loadgen`: replay the scenario's workload against prefill, receive tokens from decode, report."""

from __future__ import annotations

from kvtransit.cli._agent import add_client_flags, add_common_agent_flags, run_main
from kvtransit.cli.scenario_flags import add_scenario_args, scenario_from_args


def register(subparsers) -> None:
    p = subparsers.add_parser("loadgen", help="replay a workload and measure it as a client", description=__doc__)
    add_scenario_args(p)
    add_client_flags(p, drain_help="model seconds to wait after the last arrival before unfinished requests time out")
    add_common_agent_flags(p, "loadgen")
    p.set_defaults(func=run)


def run(args) -> int:
    from kvtransit.agents.loadgen.agent import LoadGenerator
    from kvtransit.agents.process import parse_address, parse_addresses

    scenario = scenario_from_args(args)
    generator = LoadGenerator(
        scenario, name=args.name, prefills=parse_addresses(args.prefill_at, "--prefill"),
        decodes=parse_addresses(args.decode_clients, "--decode-clients"),
        metrics_listen=parse_address(args.metrics_listen, "--metrics-listen"),
        stats_from=parse_addresses(args.stats, "--stats") if args.stats else [],
        report_path=args.report, drain_timeout_s=args.drain_timeout, ledger_path=args.ledger)

    async def main(stop):
        await generator.run(stop)

    return run_main(args, main)
