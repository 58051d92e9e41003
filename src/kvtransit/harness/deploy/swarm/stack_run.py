"""One run of docker-stack.yml on a swarm: deploy, wait until the serving services are healthy, run the load
generator once, gather its report and ledger, remove the stack (`kvtransit swarm run`).

A stack has no depends_on, so the order compose gets from it is made here: the load generator is deployed at 0
replicas and scaled to 1 once every other service shows 1/1 (swarm counts a task with a healthcheck as running only
once it is healthy). The serving agents find each other by restarting until their peers resolve (the stack's
restart policy). The stack is removed on success, on failure and on Ctrl-C (not with `keep`), and the helper waits
until its networks are no longer listed: a deploy right after a removal races the networks' deletion ("network not
found"; shared notes, measured).

Waits are polls of what swarm reports, every POLL_S, each against its own deadline; wall-clock timings of each
phase go to swarm.json beside the report.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from kvtransit.harness.deploy.swarm.docker_cli import DockerFailed, docker, last_line, service_log
from kvtransit.harness.deploy.swarm.errors import StackRunFailed, SwarmUnavailable
from kvtransit.harness.deploy.swarm.preflight import SwarmFacts, check_swarm
from kvtransit.harness.deploy.swarm.stack import (
    CLIENT,
    DEFAULT_STACK_FILE,
    DEFAULT_STACK_NAME,
    LEDGER_PATH,
    NAMESPACE_LABEL,
    PLACEMENT,
    REPORT_NAME,
    SERVING,
    SHAPED_MARK,
    SUMMARY_NAME,
    TASK_DONE,
    TASK_ENDED_BADLY,
    network_names,
    refusal,
    service_name,
    stack_env,
    task_state,
)
from kvtransit.model.judge import ledger_check
from kvtransit.model.scenario import Scenario

# Swarm's own state changes take a second or so (a task is created, assigned, started); half a second between
# looks costs little and keeps the phase timings within that.
POLL_S = 0.5
# Cold, the middlebox waits for decode's name and is restarted once or twice (1 s restart delay): about 15-20 s
# to healthy here (measured); three minutes covers a loaded box and a first pull from a registry.
READY_TIMEOUT_S = 180.0
# The load generator's run: the scenario's arrivals x dilation, its drain and its report; ten minutes unless told.
RUN_TIMEOUT_S = 600.0
# Removing five services and two overlay networks: a few seconds here (measured about 6 s until the networks go).
REMOVE_TIMEOUT_S = 60.0
RESOLVE_IMAGE = ("never", "changed", "always")


@dataclass(frozen=True)
class StackRun:
    scenario: Scenario
    runs_dir: Path  # where the load generator's report and ledger land (bind-mounted into it) and swarm.json
    stack: str = DEFAULT_STACK_NAME
    files: tuple[Path, ...] = (DEFAULT_STACK_FILE,)
    ready_timeout_s: float = READY_TIMEOUT_S
    run_timeout_s: float = RUN_TIMEOUT_S
    keep: bool = False  # leave the stack deployed after the run (for a look at it); removed by `docker stack rm`
    # `never`: the images are loaded on each node by name, no registry is asked (what the notes and CI need:
    # no registry here); `changed`/`always`: pin the digest a registry gives, so every node runs the same image.
    resolve_image: str = "never"


@dataclass
class StackResult:
    report_path: Path
    ledger_path: Path
    verdict: ledger_check.LedgerVerdict
    summary: dict[str, Any] = field(default_factory=dict)  # what swarm.json holds
    summary_path: Path | None = None


class Task(NamedTuple):
    state: str  # "Complete", "Running", ... (the state word)
    error: str
    node: str


def run_stack(run: StackRun, *, env: Mapping[str, str] | None = None,
              log: Callable[[str], None] = print) -> StackResult:
    why = refusal(run.scenario)
    if why:
        raise SwarmUnavailable(why)
    if run.resolve_image not in RESOLVE_IMAGE:
        raise SwarmUnavailable(f"resolve-image {run.resolve_image!r}: choose {', '.join(RESOLVE_IMAGE)}")
    for path in run.files:
        if not path.is_file():
            raise SwarmUnavailable(f"{path}: no such stack file (run from the repository, or give -c PATH)")
    report_path = run.runs_dir / REPORT_NAME
    if report_path.exists():
        raise SwarmUnavailable(f"{report_path} exists: give a new --runs-dir, so runs do not mix")
    env = {**(os.environ if env is None else env), **stack_env(run.scenario, run.runs_dir)}
    facts = check_swarm(env)
    run.runs_dir.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    deployed = False
    try:
        started = time.monotonic()
        deployed = True  # from here on: a deploy that fails half-way has made networks and services too
        docker(["stack", "deploy", *(arg for path in run.files for arg in ("-c", str(path))),
                "--resolve-image", run.resolve_image, run.stack], env=env, timeout_s=120)
        timings["deploy_s"] = time.monotonic() - started
        log(f"deployed stack {run.stack} in {timings['deploy_s']:.1f} s on {len(facts.nodes)} node(s); waiting for "
            f"{', '.join(SERVING)} to be healthy")
        _wait_ready(run, env)
        timings["ready_s"] = time.monotonic() - started
        log(f"healthy {timings['ready_s']:.1f} s after the deploy; starting the load generator")
        client_started = time.monotonic()
        docker(["service", "scale", "--detach", f"{service_name(run.stack, CLIENT)}=1"], env=env)
        _wait_client(run, env)
        timings["run_s"] = time.monotonic() - client_started
        log(f"the load generator finished in {timings['run_s']:.1f} s")
        result = _gather(run, env, facts, report_path)
    except BaseException as exc:
        if deployed and not run.keep:
            try:
                remove_stack(run.stack, env)
            except StackRunFailed as removal:
                if isinstance(exc, Exception):
                    raise StackRunFailed(f"{exc}; and removing the stack failed: {removal}") from exc
                log(f"removing stack {run.stack} failed: {removal}")
        raise
    if run.keep:
        log(f"stack {run.stack} left deployed (--no-remove): docker stack rm {run.stack}")
    else:
        removed = time.monotonic()
        remove_stack(run.stack, env)
        timings["remove_s"] = time.monotonic() - removed
        log(f"removed stack {run.stack} and its networks in {timings['remove_s']:.1f} s")
    result.summary["timings_s"] = {name: round(value, 2) for name, value in timings.items()}
    result.summary_path = run.runs_dir / SUMMARY_NAME
    result.summary_path.write_text(json.dumps(result.summary, indent=2) + "\n")
    return result


def _replicas(stack: str, env: Mapping[str, str]) -> dict[str, str]:
    """Each service's replicas as swarm counts them ("1/1": running, and healthy where it has a healthcheck)."""
    listed = docker(["stack", "services", stack, "--format", "{{.Name}}\t{{.Replicas}}"], env=env)
    return {name: replicas.split()[0] for name, _, replicas in (line.partition("\t") for line in listed.splitlines())
            if replicas}


def _tasks(stack: str, service: str, env: Mapping[str, str]) -> list[Task]:
    """A service's tasks, newest first (the CLI's order within a slot)."""
    listed = docker(["service", "ps", service_name(stack, service), "--no-trunc",
                     "--format", "{{.CurrentState}}\t{{.Error}}\t{{.Node}}"], env=env)
    tasks = []
    for line in listed.splitlines():
        state, _, rest = line.partition("\t")
        error, _, node = rest.partition("\t")
        tasks.append(Task(task_state(state), error.strip(), node.strip()))
    return tasks


def _trouble(stack: str, service: str, env: Mapping[str, str]) -> str:
    """What a service's newest task says, and its log's last line: why it is not up."""
    tasks = _tasks(stack, service, env)
    said = f"{tasks[0].state}{': ' + tasks[0].error if tasks[0].error else ''}" if tasks else "no task"
    lines = service_log(service_name(stack, service), env=env, tail=40)
    return said + (f" (log: {last_line(chr(10).join(lines))})" if lines else "")


def _wait_ready(run: StackRun, env: Mapping[str, str]) -> None:
    deadline = time.monotonic() + run.ready_timeout_s
    while True:
        replicas = _replicas(run.stack, env)
        waiting = [service for service in SERVING if replicas.get(service_name(run.stack, service)) != "1/1"]
        if not waiting:
            return
        if time.monotonic() >= deadline:
            raise StackRunFailed(f"stack {run.stack} not healthy in {run.ready_timeout_s:.0f} s: "
                                 + "; ".join(f"{service} {_trouble(run.stack, service, env)}" for service in waiting))
        time.sleep(POLL_S)


def _wait_client(run: StackRun, env: Mapping[str, str]) -> None:
    deadline = time.monotonic() + run.run_timeout_s
    while True:
        tasks = _tasks(run.stack, CLIENT, env)
        state = tasks[0].state if tasks else ""
        if state == TASK_DONE:
            return
        if state in TASK_ENDED_BADLY:
            raise StackRunFailed(f"the load generator's task ended {_trouble(run.stack, CLIENT, env)}")
        if time.monotonic() >= deadline:
            raise StackRunFailed(f"the load generator did not finish in {run.run_timeout_s:.0f} s (its task: "
                                 f"{state or 'not created'}); --timeout gives it longer")
        time.sleep(POLL_S)


def _gather(run: StackRun, env: Mapping[str, str], facts: SwarmFacts, report_path: Path) -> StackResult:
    services = {}
    for service in PLACEMENT:
        tasks = _tasks(run.stack, service, env)
        # The newest task's node; `tasks` counts starts (a serving agent restarted while its peer came up).
        services[service] = {"node": tasks[0].node if tasks else None, "tasks": len(tasks),
                             "state": tasks[0].state if tasks else None}
    ledger_path = run.runs_dir / LEDGER_PATH
    loadgen_node = services[CLIENT]["node"]
    for path in (report_path, ledger_path):
        if not path.is_file():
            raise StackRunFailed(f"the load generator completed on {loadgen_node} but {path} is not here")
    verdict = ledger_check.read(ledger_path)
    # The stack's middlebox shapes the KV link with tc in its container (docker/entrypoint.sh), which says so.
    shaped = [line.strip() for line in service_log(service_name(run.stack, "middlebox"), env=env)
              if SHAPED_MARK in line]
    summary = {
        "stack": run.stack,
        "files": [str(path) for path in run.files],
        "engine_api": facts.api,
        "swarm_nodes": len(facts.nodes),
        "services": services,
        "link_shaper": shaped[-1] if shaped else "not shaped by tc: the middlebox's log has no shaping line",
        "report": str(report_path),
        "ledger": {**verdict.summary(), "passed": verdict.ok, "problems": verdict.problems()},
    }
    return StackResult(report_path=report_path, ledger_path=ledger_path, verdict=verdict, summary=summary)


def _stack_rm(stack: str, env: Mapping[str, str]) -> bool:
    """`docker stack rm STACK`: True when it removed everything it found (or found nothing: a deploy that failed
    before making anything), False when a network was left because a task still used it."""
    try:
        docker(["stack", "rm", stack], env=env)
    except DockerFailed as exc:
        if "Nothing found in stack" in str(exc):
            return True
        if "is in use by task" in str(exc):
            return False
        raise
    return True


def remove_stack(stack: str, env: Mapping[str, str], timeout_s: float = REMOVE_TIMEOUT_S) -> None:
    """`docker stack rm`, then wait until its networks are no longer listed and its containers are gone (on this
    node: the one the CLI sees), by exact name and by the stack's label, never by pattern. Docker removes the
    services, then their networks without waiting for the tasks to stop: a network still used by a stopping task
    is left ("is in use by task"), so the removal is asked again once the stack's containers are gone."""
    removed = _stack_rm(stack, env)
    networks = set(network_names(stack))
    deadline = time.monotonic() + timeout_s
    while True:
        left = sorted(networks & set(docker(["network", "ls", "--format", "{{.Name}}"], env=env).split()))
        containers = docker(["ps", "-a", "-q", "--filter", f"label={NAMESPACE_LABEL}={stack}"], env=env).split()
        if not left and not containers:
            return
        if not removed and not containers:
            removed = _stack_rm(stack, env)  # the tasks have stopped: their networks can go now
        if time.monotonic() >= deadline:
            raise StackRunFailed(f"stack {stack} removed, but after {timeout_s:.0f} s these are still there: "
                                 + ", ".join([*left, *(f"container {c}" for c in containers)]))
        time.sleep(POLL_S)
