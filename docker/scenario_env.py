"""Print the .env lines that give every compose agent one scenario: the same flags `kvtransit up` takes.

    python docker/scenario_env.py --link eth-100g --rate 4 --requests 50 > .env.scenario   # then paste

The first line is `Scenario(...).to_argv()`: every field spelled out, exactly what the embedded launcher passes
to each process, so the two ways to bring the testbed up cannot drift apart. A flow adds lines of its own
(harness/deploy/flow_deploy.py: the tier's `--kv-pool pool` starts the `kvpool` profile and wires the pool in as the
launcher does: the middlebox dials the pool and opens its pool port, the prefill reaches the pool through that port,
and the load generator joins the pool's /stats into the report; docker-compose.yml reads each variable), or refuses
in one line what compose cannot carry yet.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from kvtransit.cli.scenario_flags import add_scenario_args, scenario_from_args
from kvtransit.harness.deploy.flow_deploy import flow_deploys, refusal

ENV_NAME = "KVTRANSIT_SCENARIO"


def env_lines(argv: list[str]) -> list[str]:
    parser = argparse.ArgumentParser(prog="scenario_env.py", description=__doc__)
    add_scenario_args(parser)
    scenario = scenario_from_args(parser.parse_args(argv))
    if why := refusal(scenario, "compose", "the compose testbed"):  # a flow compose does not carry (yet)
        raise SystemExit(f"scenario_env.py: {why}")
    lines = [f"{ENV_NAME}={shlex.join(scenario.to_argv())}"]
    for deploy in flow_deploys(scenario):  # a flow's own lines (the tier's pool profile and its wiring)
        lines += [f"{name}={value}" for name, value in deploy.compose_env(scenario).items()]
    return lines


def scenario_line(argv: list[str]) -> str:
    """The KVTRANSIT_SCENARIO line alone."""
    return env_lines(argv)[0]


if __name__ == "__main__":
    print("\n".join(env_lines(sys.argv[1:])))
