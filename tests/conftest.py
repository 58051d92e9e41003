"""Test-suite settings shared by every layer: the layers' markers, the fast tier's guard, hypothesis profiles.

- Layers: a test under tests/integration, system, chaos or load is marked with its layer and `slow` (they start
  processes). `python -m pytest -m "not slow" -n 2` is the inner loop (both cores, pytest-xdist): the unit tier,
  minus the unit tests marked `slow` by hand (those that start a process: a CLI in a child, docker-compose,
  kustomize).
- The fast tier's guard: a test not marked `slow` that starts a process (subprocess, asyncio's subprocesses,
  os.fork, multiprocessing) fails naming this rule, so the inner loop stays process-free and under a minute.

- "default": a few hundred examples per property, for local runs.
- "ci": loaded when CI=true (CI sets it): more examples for every property, no deadline (a shared CI box
  stalls now and then).
- "fuzz" / "fuzz-ci": what the fuzz tests of untrusted input use (tests/unit/_fuzz.py picks one by CI): under
  CI the wire parser and the control API each see at least 10,000 inputs, in well under 3 minutes in all.

`pytest --hypothesis-profile NAME` still picks one explicitly; KVTRANSIT_FUZZ_EXAMPLES overrides the count of
the fuzz tests alone.
"""

import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

TESTS = Path(__file__).resolve().parent
SLOW_LAYERS = ("integration", "system", "chaos", "load")  # each a marker of its own in pyproject.toml

ON_CI = os.environ.get("CI", "").lower() == "true"

settings.register_profile("default", max_examples=300, deadline=None)
# 1,000, not 10,000, for the ordinary properties: at 10,000 the model's pure properties alone took a minute.
settings.register_profile("ci", max_examples=1_000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("fuzz", max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("fuzz-ci", max_examples=10_000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if ON_CI else "default")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        try:
            layer = item.path.resolve().relative_to(TESTS).parts[0]
        except ValueError:
            continue
        if layer in SLOW_LAYERS:
            item.add_marker(getattr(pytest.mark, layer))
            item.add_marker(pytest.mark.slow)


class ProcessInFastTier(AssertionError):
    """A test outside the `slow` marker started a process."""


def _refuse(what: str):
    def refuse(*args: object, **kwargs: object):
        raise ProcessInFastTier(f"{what} in a test not marked slow: the fast tier (-m 'not slow') starts no "
                                f"process; mark the test @pytest.mark.slow (tests/conftest.py)")
    return refuse


@pytest.fixture(autouse=True)
def _fast_tier_starts_no_process(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.node.get_closest_marker("slow") is not None:
        return
    # Popen._execute_child is where subprocess.run, check_output and asyncio's subprocesses all end up;
    # os.fork and os.posix_spawn are where multiprocessing and the rest do.
    monkeypatch.setattr(subprocess.Popen, "_execute_child", _refuse("subprocess.Popen"))
    monkeypatch.setattr(os, "fork", _refuse("os.fork"))
    monkeypatch.setattr(os, "posix_spawn", _refuse("os.posix_spawn"))
    monkeypatch.setattr(os, "posix_spawnp", _refuse("os.posix_spawnp"))
