"""The switch process: `python -m kvtransit.agents.switch --config JSON` (started by emulator/collective_run.py).

It binds, prints the readiness line (listen_port), serves one group until every rank said BYE, the collective
failed, or it is stopped, then prints one `KVTRANSIT-RESULT {json}` line (SwitchServer.stats) and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from kvtransit.agents.collective.rank import RANK_SPIN_S
from kvtransit.agents.common.process import announce_ready, announce_result, run_until_stopped
from kvtransit.model.module import Module
from kvtransit.runtime.clock import MonotonicClock

from .server import SwitchServer


async def switch_main(config: dict[str, Any], stop: asyncio.Event) -> None:
    module = Module(ops_per_byte=float(config.get("module_ops_per_byte", Module().ops_per_byte)),
                    added_latency_s=float(config.get("module_latency_s", Module().added_latency_s)))
    server = SwitchServer(MonotonicClock(spin_s=RANK_SPIN_S), group=int(config["group"]), size=int(config["size"]),
                          rate_Bps=float(config["rate_Bps"]), latency_s=float(config["latency_s"]), module=module,
                          scale=float(config.get("scale", 1.0)), deadline_s=float(config.get("deadline_s", 60.0)),
                          collectives=int(config.get("collectives", 0)))
    port = await server.start(str(config.get("host", "127.0.0.1")), int(config.get("port", 0)))
    announce_ready("switch", "switch", listen_port=port)
    done, stopped = asyncio.ensure_future(server.done.wait()), asyncio.ensure_future(stop.wait())
    await asyncio.wait({done, stopped}, return_when=asyncio.FIRST_COMPLETED)
    done.cancel()
    stopped.cancel()
    await asyncio.sleep(0.05)  # let the last ABORTs or BYEs flush before the connections close
    await server.close()
    announce_result(server.stats())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvtransit.agents.switch")
    parser.add_argument("--config", required=True,
                        help="JSON: group, size, rate_Bps, latency_s, module_ops_per_byte, module_latency_s, scale")
    config = json.loads(parser.parse_args(argv).config)
    asyncio.run(run_until_stopped(lambda stop: switch_main(config, stop)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
