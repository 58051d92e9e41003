"""`kvtransit decode`: one decode instance (reassemble KV, continuous batching, stream tokens)."""

from __future__ import annotations

from ._agent import add_common_agent_flags, run_agent
from .scenario_flags import add_scenario_args, scenario_from_args


def register(subparsers) -> None:
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
    p.add_argument("--tp-group", default="", metavar="JSON",
                   help="with --decode-tp N > 1: the group this decode leads as rank 0, its N - 1 follower ranks' "
                        "ports and the switch's (`kvtransit up` starts them and gives this; "
                        "agents/tp_group/leader.py: LeaderConfig)")
    add_common_agent_flags(p, "decode")
    p.set_defaults(func=run)


def run(args) -> int:
    from kvtransit.agents.common.process import parse_address
    from kvtransit.agents.decode.agent import DecodeAgent

    from ._common import CliError

    if args.accuracy_sample < 0:
        raise CliError(f"--accuracy-sample must be >= 0, got {args.accuracy_sample}")
    scenario = scenario_from_args(args)
    tp_group = _tp_group(args.tp_group, scenario.decode_tp)
    agent = DecodeAgent(scenario, name=args.name, listen=parse_address(args.listen, "--listen"),
                        client_listen=parse_address(args.client_listen, "--client-listen"),
                        metrics_listen=parse_address(args.metrics_listen, "--metrics-listen"),
                        accuracy_sample=args.accuracy_sample, link_backend=args.link_backend, tp_group=tp_group)
    return run_agent(args, lambda: agent.run)


def _tp_group(text: str, decode_tp: int):
    """The group to lead (`--tp-group JSON`), given exactly when `--decode-tp` > 1; a bad one is one line."""
    import json

    from kvtransit.agents.tp_group.leader import LeaderConfig

    from ._common import CliError

    if decode_tp == 1:
        if text:
            raise CliError("--tp-group: given with --decode-tp 1 (a decode of one GPU has no group to lead)")
        return None
    if not text:
        raise CliError(f"--tp-group: --decode-tp {decode_tp} needs the group's followers (kvtransit up starts them "
                       "and passes this flag)")
    try:
        return LeaderConfig(**json.loads(text))
    except (ValueError, TypeError) as exc:
        raise CliError(f"--tp-group: {exc}") from None
