"""`kvtransit middlebox`: the module on the hand-off link (kernel, budget, energy, shaped egress)."""

from __future__ import annotations

import os

from ._agent import add_common_agent_flags, run_agent
from .scenario_flags import add_scenario_args, scenario_from_args


def register(subparsers) -> None:
    p = subparsers.add_parser("middlebox", help="run the compute-in-transit module on the hand-off link",
                              description=__doc__)
    add_scenario_args(p)
    p.add_argument("--listen", default="127.0.0.1:0", metavar="HOST:PORT",
                   help="where prefill instances send KV (default 127.0.0.1:0, any free port)")
    p.add_argument("--decode", required=True, metavar="HOST:PORT[,HOST:PORT...]",
                   help="decode instances' KV addresses (their --listen)")
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
    p.add_argument("--pool-listen", default="127.0.0.1:0", metavar="HOST:PORT",
                   help="with --kvpool: where prefills reach the pool (default 127.0.0.1:0, any free port)")
    add_common_agent_flags(p, "middlebox")
    p.set_defaults(func=run)


def run(args) -> int:
    from kvtransit.agents.common.process import parse_address, parse_addresses
    from kvtransit.agents.middlebox.process import MiddleboxProcess

    process = MiddleboxProcess(
        scenario_from_args(args), name=args.name, listen=parse_address(args.listen, "--listen"),
        decodes=parse_addresses(args.decode, "--decode"),
        metrics_listen=parse_address(args.metrics_listen, "--metrics-listen"),
        control_listen=parse_address(args.control_listen, "--control-listen"),
        control_token=os.environ.get(args.control_token_env) or None, link_backend=args.link_backend,
        kvpool=parse_address(args.kvpool, "--kvpool") if args.kvpool else None,
        pool_listen=parse_address(args.pool_listen, "--pool-listen"))
    return run_agent(args, lambda: process.run)
