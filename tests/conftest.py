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

Both cores (pytest-xdist, `-n 2 --dist loadgroup`): a live test that holds a measured figure against the model needs
the box to itself, since the host's own work is what it measures. So under xdist every test holds a lock for its
whole run, setup to teardown (outside pytest-timeout's clock): a `slow` test takes it alone unless it is marked
`shares_host` (it judges what happened, not how fast: a ledger, an outcome, the bytes), every other test shares it.
A module's tests run on one worker, so its module fixtures run once; the modules that read one session fixture
run together (SESSION_GROUPS).
"""

import fcntl
import os
import subprocess
import tempfile
from collections.abc import Iterator
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


# Modules kept on one worker: those that read one session fixture (tests/integration/conftest.py), so it runs once,
# and those that drive the one Docker engine (a Swarm joined while a compose project builds is not their test).
SESSION_GROUPS = {"integration/test_serving_loop.py": "light-run", "integration/test_request_ledger.py": "light-run",
                  "system/test_compose_testbed.py": "docker", "system/test_compose_default_build.py": "docker",
                  "system/test_swarm_stack.py": "docker"}


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups (its own hook of the same name)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    grouped = config.pluginmanager.hasplugin("xdist")  # its marker exists only with it
    for item in items:
        try:
            relative = item.path.resolve().relative_to(TESTS)
        except ValueError:
            continue
        layer = relative.parts[0]
        if layer in SLOW_LAYERS:
            item.add_marker(getattr(pytest.mark, layer))
            item.add_marker(pytest.mark.slow)
        if grouped:
            path = relative.as_posix()
            item.add_marker(pytest.mark.xdist_group(SESSION_GROUPS.get(path, path)))
    if grouped:
        items.sort(key=_phase)


def _phase(item: pytest.Item) -> int:
    """When a test runs under `-n 2`: what may share the host first, the tests that need it alone last.

    A test that needs the box to itself (the host lock below) idles the other worker for its whole run, so the run is
    shortest when the shared work runs side by side on both workers first, the longest of it earliest (the Docker
    engine's group, then the shared live tests, then the fast tier), and the tests that run alone follow one after
    another. xdist hands out groups in this order (its own reordering by size is turned off in pytest_configure)."""
    markers = {m.name for m in item.iter_markers()}
    if "shares_host" in markers and "xdist_group" in markers and any(
            m.kwargs.get("name", m.args[0] if m.args else None) == "docker" for m in item.iter_markers("xdist_group")):
        return 0
    if "slow" not in markers:
        return 2
    return 1 if "shares_host" in markers else 3


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config.option, "loadscopereorder"):  # xdist's: groups by size, largest first; ours is _phase's order
        config.option.loadscopereorder = False


def _host_lock() -> Path | None:
    """This `-n` run's lock file (None: not under xdist)."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")  # set in every worker of one `-n` run, the same in all
    return None if run is None else Path(tempfile.gettempdir()) / f"kvtransit-tests-{run}.lock"


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    path = _host_lock()
    if path is None:
        yield
        return
    alone = item.get_closest_marker("slow") is not None and item.get_closest_marker("shares_host") is None
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A worker done removes the lock file: a worker still running makes a new one for its next test, with no one
    left to share it with."""
    if (path := _host_lock()) is not None:
        path.unlink(missing_ok=True)


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


def pytest_sessionstart(session: pytest.Session) -> None:
    """Build matplotlib's font cache before any test runs, where it is not built yet: on a fresh machine its first
    import lists the system's fonts with `fc-list` (a process), which the fast tier's guard would refuse inside
    whichever figure test came first, and the figures would be drawn without it (none drawn). A machine's one-time
    set-up, not a test's work."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is not None:  # without the plots extra the figure tests skip
        import matplotlib.font_manager  # noqa: F401  (the import builds ~/.cache/matplotlib/fontlist-*.json)
