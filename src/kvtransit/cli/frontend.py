"""`kvtransit frontend`: an OpenAI-compatible server whose requests drive the testbed (a load generator fed from
outside; `kvtransit up --frontend` starts it in the load generator's place).

GET /v1/models, POST /v1/completions and /v1/chat/completions (streamed or whole) on --openai-listen. Each
request becomes one testbed request (prompt tokens as --tokenizer counts them, output tokens = max_tokens), its
tokens streamed back as decode emits them; all of them go into the ledger and the run report. The run ends after
--max-requests requests, after --duration seconds, or when stopped (Ctrl-C / SIGTERM), whichever comes first;
with neither limit it serves until stopped.
"""

from __future__ import annotations

from kvtransit.cli._agent import add_client_flags, add_common_agent_flags, run_main
from kvtransit.cli.scenario_flags import add_scenario_args, scenario_from_args

DEFAULT_OPENAI_LISTEN = "127.0.0.1:8000"  # vLLM's and `vllm bench serve`'s default port


def add_frontend_flags(parser, *, prefix: str = "") -> None:
    """The front end's own flags; `kvtransit up` adds them as --frontend-listen/-requests/-duration."""
    listen, requests, duration = ((f"--{prefix}listen", f"--{prefix}requests", f"--{prefix}duration") if prefix
                                  else ("--openai-listen", "--max-requests", "--duration"))
    parser.add_argument(listen, dest="openai_listen", default=DEFAULT_OPENAI_LISTEN, metavar="HOST:PORT",
                        help=f"where the OpenAI API listens (default {DEFAULT_OPENAI_LISTEN}; port 0: any free one)")
    parser.add_argument(requests, dest="max_requests", type=int, default=0, metavar="N",
                        help="end the run once N requests were taken (later ones get 503), after those in flight "
                             "finish (default 0: no count limit)")
    parser.add_argument(duration, dest="duration", type=float, default=0.0, metavar="SECONDS",
                        help="end the run this many wall seconds after it starts taking requests (default 0: none)")
    parser.add_argument("--tokenizer", choices=("auto", "smollm2", "bytes"), default="auto",
                        help="how prompt tokens are counted: SmolLM2's tokenizer from the realkv extra, a bytes/4 "
                             "estimate, or the tokenizer when installed (auto, the default)")
    parser.add_argument("--served-model-name", default=None, metavar="NAME",
                        help="the model name clients ask for (default: the scenario's --model)")


def check_frontend_flags(args) -> None:
    from kvtransit.model.errors import ConfigError

    if args.max_requests < 0:
        raise ConfigError(f"--max-requests/--frontend-requests must be >= 0 (0: no limit), got {args.max_requests}")
    if not args.duration >= 0:
        raise ConfigError(f"--duration/--frontend-duration must be >= 0 seconds (0: none), got {args.duration}")


def register(subparsers) -> None:
    p = subparsers.add_parser("frontend", help="serve the OpenAI API, each request a testbed request",
                              description=__doc__)
    add_scenario_args(p)
    add_client_flags(p, drain_help="model seconds to wait, once the run ends, for requests in flight before they "
                                   "time out")
    add_frontend_flags(p)
    add_common_agent_flags(p, "frontend")
    p.set_defaults(func=run)


def run(args) -> int:
    from kvtransit.agents.frontend.bridge import FrontendGenerator
    from kvtransit.agents.frontend.prompt_tokens import load_counter
    from kvtransit.agents.process import parse_address, parse_addresses

    scenario = scenario_from_args(args)
    check_frontend_flags(args)
    frontend = FrontendGenerator(
        scenario, name=args.name, prefills=parse_addresses(args.prefill_at, "--prefill"),
        decodes=parse_addresses(args.decode_clients, "--decode-clients"),
        metrics_listen=parse_address(args.metrics_listen, "--metrics-listen"),
        openai_listen=parse_address(args.openai_listen, "--openai-listen"), counter=load_counter(args.tokenizer),
        served_model=args.served_model_name, max_requests=args.max_requests, duration_s=args.duration,
        stats_from=parse_addresses(args.stats, "--stats") if args.stats else [],
        report_path=args.report, drain_timeout_s=args.drain_timeout, ledger_path=args.ledger)

    async def main(stop):
        await frontend.run(stop)

    return run_main(args, main)
