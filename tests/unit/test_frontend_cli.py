"""`kvtransit frontend` and `kvtransit up --frontend`: the launcher's command for the front end is one its own
parser takes, with the options `up` was given; bad values are one-line errors."""

from __future__ import annotations

import pytest

from kvtransit.cli import build_parser
from kvtransit.cli import main as cli_main
from kvtransit.harness.up.agent_commands import FrontendOptions, agent_commands
from kvtransit.model.scenario import Scenario


def _parse_agent(argv: list[str]):
    program = argv.index("frontend")  # after `python -m kvtransit.cli`
    return build_parser().parse_args(argv[program:])


def test_the_launchers_frontend_command_carries_its_options_and_the_loadgens_peers():
    options = FrontendOptions(listen="127.0.0.1:0", max_requests=7, duration_s=2.5, tokenizer="bytes",
                              served_model="my-model")
    commands = agent_commands(Scenario(rate=3.0), prefills="127.0.0.1:1", decode_clients="127.0.0.1:2",
                              stats="127.0.0.1:3", report="r.json", frontend=options)
    args = _parse_agent(commands["frontend"])
    assert (args.openai_listen, args.max_requests, args.duration, args.tokenizer, args.served_model_name) == \
        ("127.0.0.1:0", 7, 2.5, "bytes", "my-model")
    assert (args.prefill_at, args.decode_clients, args.stats, str(args.report)) == \
        ("127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3", "r.json")
    assert args.scenario_rate == 3.0
    loadgen = commands["loadgen"]
    assert loadgen[loadgen.index("--prefill"):] == commands["frontend"][commands["frontend"].index("--prefill"):
                                                                      commands["frontend"].index("--openai-listen")]


def test_up_takes_the_frontend_flags_under_its_own_names():
    args = build_parser().parse_args(["up", "--frontend", "--frontend-listen", "0.0.0.0:9000",
                                      "--frontend-requests", "5", "--frontend-duration", "30", "--tokenizer", "bytes",
                                      "--result-format", "vllm"])
    assert (args.frontend, args.openai_listen, args.max_requests, args.duration, args.tokenizer,
            args.result_format) == (True, "0.0.0.0:9000", 5, 30.0, "bytes", "vllm")


@pytest.mark.parametrize("argv,fragment", [
    (["up", "--frontend", "--frontend-requests", "-1"], "--frontend-requests must be >= 0"),
    (["up", "--frontend", "--frontend-duration", "-2"], "--frontend-duration must be >= 0"),
])
def test_a_negative_limit_is_one_line_naming_the_flag(argv, fragment, capsys):
    assert cli_main([*argv, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert fragment in err and err.count("\n") == 1
