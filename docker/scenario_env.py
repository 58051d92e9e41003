"""Print the .env line that gives every compose agent one scenario: the same flags `kvtransit up` takes.

    python docker/scenario_env.py --link eth-100g --rate 4 --requests 50 > .env.scenario   # then paste

The line is `Scenario(...).to_argv()`: every field spelled out, exactly what the embedded launcher passes to
each process, so the two ways to bring the testbed up cannot drift apart.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from kvtransit.cli.scenario_flags import add_scenario_args, scenario_from_args

ENV_NAME = "KVTRANSIT_SCENARIO"


def scenario_line(argv: list[str]) -> str:
    parser = argparse.ArgumentParser(prog="scenario_env.py", description=__doc__)
    add_scenario_args(parser)
    scenario = scenario_from_args(parser.parse_args(argv))
    return f"{ENV_NAME}={shlex.join(scenario.to_argv())}"


if __name__ == "__main__":
    print(scenario_line(sys.argv[1:]))
