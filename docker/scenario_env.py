"""Print the .env lines that give every compose agent one scenario: the same flags `kvtransit up` takes.

    python docker/scenario_env.py --link eth-100g --rate 4 --requests 50 > .env.scenario   # then paste

The first line is `Scenario(...).to_argv()`: every field spelled out, exactly what the embedded launcher passes
to each process, so the two ways to bring the testbed up cannot drift apart. A scenario with the shared KV pool
(`--kv-pool pool`) adds the lines that start the `kvpool` profile and wire the pool in as the launcher does:
the middlebox dials the pool and opens its pool port, the prefill reaches the pool through that port, and the
load generator joins the pool's /stats into the report (docker-compose.yml reads each variable).
"""

from __future__ import annotations

import argparse
import shlex
import sys

from kvtransit.cli.scenario_flags import add_scenario_args, scenario_from_args

ENV_NAME = "KVTRANSIT_SCENARIO"
# Ports as docker-compose.yml gives them: every agent's ingress 9000 and /metrics 9100; the middlebox's pool
# port 9300 (beside its 9000 ingress and 9200 control).
POOL_ENV = {
    "COMPOSE_PROFILES": "kvpool",
    "KVTRANSIT_MIDDLEBOX_POOL_FLAGS": "--kvpool kvpool:9000 --pool-listen 0.0.0.0:9300",
    "KVTRANSIT_PREFILL_POOL_FLAGS": "--kv-pool-via middlebox:9300",
    "KVTRANSIT_POOL_STATS": ",kvpool:9100",
}


def env_lines(argv: list[str]) -> list[str]:
    parser = argparse.ArgumentParser(prog="scenario_env.py", description=__doc__)
    add_scenario_args(parser)
    scenario = scenario_from_args(parser.parse_args(argv))
    if scenario.remote_kv:
        raise SystemExit("scenario_env.py: --kv-placement remote: the compose testbed does not wire remote KV's legs "
                         "(decode's and the pool's remote-KV ports through the middlebox); run it with `kvtransit up`")
    if scenario.ring:
        raise SystemExit("scenario_env.py: --ring-share: the compose testbed's prefill has no ring's follower ranks "
                         "beside it; run it with `kvtransit up`")
    if scenario.pool_warm != "off":
        raise SystemExit("scenario_env.py: --pool-warm trace: the compose testbed's kvpool container has no trace file "
                         "to warm from; run it with `kvtransit up`")
    lines = [f"{ENV_NAME}={shlex.join(scenario.to_argv())}"]
    if scenario.kv_pool == "pool":
        lines += [f"{name}={value}" for name, value in POOL_ENV.items()]
    return lines


def scenario_line(argv: list[str]) -> str:
    """The KVTRANSIT_SCENARIO line alone."""
    return env_lines(argv)[0]


if __name__ == "__main__":
    print("\n".join(env_lines(sys.argv[1:])))
