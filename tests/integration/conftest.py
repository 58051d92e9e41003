"""Live runs that tests in more than one module judge: each is run once a session, and every test reads its record.

- `light_loopback_run`: the serving loop's light run (test_serving_loop.py: real decode, middlebox, prefill and load
  generator on loopback, codec none, one request every 0.5 s, nothing queues). Its report is held against the model
  there; its request ledger is reconciled with that report and the Prometheus counter in test_request_ledger.py,
  which holds for any run, so it reads this one instead of starting its own.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvtransit.harness.up.launcher import Launcher
from kvtransit.model.scenario import Scenario
from tests.integration._light_run import LIGHT, LIGHT_ACCURACY_SAMPLE


@dataclass(frozen=True)
class LiveRun:
    scenario: Scenario
    report_path: Path
    run_dir: Path  # the launcher's (the ledger, the links manifest)
    report: dict


@pytest.fixture(scope="session")
def light_loopback_run(tmp_path_factory) -> LiveRun:
    scenario = Scenario.build(codec="none", **LIGHT)
    report_path = tmp_path_factory.mktemp("light") / "light.json"
    launcher = Launcher(scenario, report_path=report_path, drain_timeout_s=20.0,
                        accuracy_sample=LIGHT_ACCURACY_SAMPLE, log=lambda _msg: None)
    path = asyncio.run(launcher.run(asyncio.Event()))
    assert path is not None, "the light run wrote no report"
    return LiveRun(scenario, path, launcher.run_dir, json.loads(path.read_text()))
