"""`kvtransit up`: start a run's processes, supervise them, stop them, and show the report.

Order: decode(s) → (kvpool, with --kv-pool pool) → middlebox → prefill(s) → loadgen, each `sys.executable -m
kvtransit.cli <role> <scenario flags> …` with every port 0, its ports learnt from its `KVTRANSIT-READY` line (no
races, no guessing). Each child runs in its own session, so a terminal's Ctrl-C reaches only the launcher, which
then stops the run in order: the load generator first (it writes the report of what completed), then the rest,
each by its pid (SIGTERM, then SIGKILL after a grace period).

A child that exits while the run is on is a crash: the launcher names it, shows its last stderr lines,
stops the run the same way, and still leaves the report of what completed.

Placement (`placement.py`): with `--links auto|netns` on a host that can, the middlebox and the decode pool run in
network namespaces and tc shapes the middlebox → decode veth; the namespaces, veths and qdiscs are removed by
exact name when the run ends, fails or is interrupted (the manifest in the run dir lists them for
`kvtransit links clean --manifest` after a crash of the launcher itself).

The OpenAI front end (`--frontend`, `FrontendOptions`): `kvtransit frontend` runs in the load generator's place
(same peers, report and ledger), its requests coming from outside clients instead of the drawn workload; its URL
is announced once it is ready, and the run lasts until its own end condition (a request count, a duration) or
Ctrl-C (agents/frontend/bridge.py).

Prometheus (`--prometheus`): started once every agent is ready, scraping each one's /metrics; after a run that
ends normally the agents and Prometheus are kept up PROMETHEUS_LINGER_SCRAPES scrape intervals, so the run's
last figures are scraped too, then the agents stop, then Prometheus (by its pid, also on error or Ctrl-C).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from kvtransit.agents.process import SUPERVISED_ENV
from kvtransit.harness.children import Child, ChildFailed
from kvtransit.harness.up.agent_commands import AGENT_MODULE, FrontendOptions, agent_commands
from kvtransit.harness.up.flow_launch import FlowLaunch, check_host_room, flow_launches
from kvtransit.harness.up.placement import LinkSetup, choose_links
from kvtransit.harness.up.supervisor import MAX_RESTARTS, pinned_argv
from kvtransit.model.scenario import REAL_MODEL_KV, Scenario
from kvtransit.runtime.http_client import get_json

if TYPE_CHECKING:  # imported where it starts (only with --prometheus)
    from kvtransit.harness.up.prometheus import PrometheusProcess

READY_TIMEOUT_S = 60.0  # a cold start imports numpy, scipy, prometheus_client: seconds on a busy box
# `--kv-sample real`: the prefill loads the real model and prefills its windows before it is ready (22 s to load
# and 1.4 s a 512-token window on this 2-core box, measured; several times that on a busy one).
REAL_KV_READY_EXTRA_S = 180.0
STOP_GRACE_S = 5.0
# After a normal end with --prometheus: keep agents and Prometheus up this many scrape intervals, so the
# run's last figures are scraped (one interval may just have begun when the run ended; two cover it).
PROMETHEUS_LINGER_SCRAPES = 2
PROMETHEUS_SCRAPE_INTERVAL_S = 1.0  # prometheus/prometheus.yml: global.scrape_interval


# The core's roles whose /stats join the run report (a flow's LAUNCH names its own: STATS_ROLES).
STATS_ROLES = ("decode", "middlebox", "prefill")
# The client roles: one of them per run, started last and stopped first (it writes the report).
CLIENT_ROLES = ("loadgen", "frontend")


class RunFailed(Exception):
    """A child process failed; the message names it and quotes its last error lines."""


class Launcher:
    def __init__(self, scenario: Scenario, *, report_path: Path, middlebox_command: list[str] | None = None,
                 accuracy_sample: int = 8, drain_timeout_s: float | None = None,
                 on_progress: Callable[[dict], None] | None = None, log: Callable[[str], None] = print,
                 links: str = "loopback", prometheus: bool = False, run_dir: Path | None = None,
                 restart_roles: tuple[str, ...] = (), frontend: FrontendOptions | None = None,
                 child_env: Mapping[str, str] | None = None, figures: bool = True):
        """`links`: "auto" | "netns" | "loopback" (placement.py). `prometheus`: start a real one once every agent is
        ready. `run_dir` holds the links manifest and Prometheus's config (default: REPORT.run/ beside the
        report). `restart_roles`: children of these roles ("middlebox", "decode") that exit mid-run are
        restarted on the same ports (supervisor.py), at most MAX_RESTARTS times each; any other exit is a
        crash that stops the run. `frontend`: run the OpenAI front end in the load generator's place. `child_env`:
        variables every child gets beside this process's environment (a chaos run's shortened hand-off deadline),
        so runs side by side in one process each give their own. `figures`: draw the report's PNGs after the run
        (report/plots.py: about 2.6 s here, matplotlib's import included; `kvtransit up --no-figures`)."""
        self.scenario = scenario
        self.report_path = Path(report_path)
        self.links_mode = links
        self.want_prometheus = prometheus
        self.run_dir = Path(run_dir) if run_dir is not None else self.report_path.with_suffix(".run")
        self.link_setup: LinkSetup | None = None
        self.prometheus: PrometheusProcess | None = None  # while it runs
        self.middlebox_command = middlebox_command or [*AGENT_MODULE, "middlebox"]
        self.accuracy_sample = accuracy_sample
        self.drain_timeout_s = drain_timeout_s
        self.on_progress = on_progress
        self.log = log
        self.children: list[Child] = []
        self.crashed: Child | None = None
        self.restart_roles = tuple(restart_roles)
        self.restarts: list[dict] = []  # {"name", "exited_at", "ready_at"}: monotonic seconds
        self.group_losses: list[str] = []  # a flow's group processes that exited mid-run (their leader fails requests)
        self.frontend = frontend
        self.launches: list[FlowLaunch] = flow_launches(scenario)  # what the scenario's flows start beside ours
        self.group_roles = {role for launch in self.launches for role in launch.GROUP_ROLES}
        self.frontend_url: str | None = None  # once the front end said it is ready
        self.child_env = dict(child_env or {})
        self.figures = figures

    # -- processes -----------------------------------------------------------------------------------------

    async def _start(self, child: Child) -> dict:
        self.children.append(child)
        await child.start(env={**os.environ, **self.child_env, SUPERVISED_ENV: str(os.getpid())}, new_session=True)
        timeout_s = (READY_TIMEOUT_S + (REAL_KV_READY_EXTRA_S if child.role == "prefill"
                                        and self.scenario.kv_sample == REAL_MODEL_KV else 0.0)
                     + sum(launch.ready_extra_s(self.scenario, child.role) for launch in self.launches))
        try:
            return await child.wait_ready(timeout_s)
        except ChildFailed as exc:
            raise RunFailed(str(exc)) from None

    async def stop_all(self) -> None:
        """The load generator first (it writes the report), then the rest in reverse start order."""
        loadgens = [c for c in self.children if c.role in CLIENT_ROLES]
        for child in loadgens:
            await child.stop(STOP_GRACE_S)
        for child in reversed([c for c in self.children if c.role not in CLIENT_ROLES]):
            await child.stop(STOP_GRACE_S)

    # -- the run -------------------------------------------------------------------------------------------

    @property
    def _links(self) -> LinkSetup:
        assert self.link_setup is not None, "run() chooses the links before it starts anything"
        return self.link_setup

    def _command(self, role: str, index: int = 0, *flow_flags: str, **known: str) -> list[str]:
        """A core role's argv (agent_commands), what the flows add to it, placed where it runs."""
        setup = self._links
        argv = agent_commands(self.scenario, index=index, report=str(self.report_path),
                              accuracy_sample=self.accuracy_sample, drain_timeout_s=self.drain_timeout_s,
                              middlebox_command=self.middlebox_command, link_backend=setup.link_backend,
                              hosts=setup.host, frontend=self.frontend, **known)[role]
        flags = [flag for launch in self.launches for flag in launch.flags(self, role, index)]
        return setup.wrap(role, [*argv, *flags, *flow_flags])

    def _child(self, name: str, role: str, argv: list[str], place: str | None = None) -> Child:
        """`place`: the role it runs beside (its own, unless given: a flow's processes run with a core role's)."""
        setup, place = self._links, place or role
        return Child(name, role, argv, host=setup.host(place, "front"), kv_host=setup.host(place, "kv"))

    # -- what a flow's LAUNCH sees of us (harness/up/flow_launch.py: LaunchContext) ----------------------------

    async def start(self, name: str, role: str, argv: list[str], *, place: str) -> dict:
        return await self._start(self._child(name, role, argv, place=place))

    def wrap(self, place: str, argv: list[str]) -> list[str]:
        return self._links.wrap(place, argv)

    def host(self, place: str, socket: str = "front") -> str:
        return self._links.host(place, socket)

    def ready_lines(self, role: str) -> list[dict]:
        return [child.ready_info for child in self.children if child.role == role]

    def addresses(self, role: str, port_key: str) -> str:
        return _addresses([child for child in self.children if child.role == role], port_key)

    async def _before(self, role: str, index: int) -> list[str]:
        """Every flow's processes beside instance `index` of `role`, started first; the flags that tell it."""
        return [flag for launch in self.launches for flag in await launch.before(self, role, index)]

    async def _after(self, role: str) -> None:
        for launch in self.launches:
            await launch.after(self, role)

    def _check_flows(self) -> None:
        """Every flow's refusals, and the host's room for their rank processes (harness/host.py), before anything
        starts: one line each."""
        for launch in self.launches:
            launch.check(self)
        check_host_room(self.scenario, self.launches)

    async def _start_prometheus(self, ready: list[Child]) -> None:
        from kvtransit.harness.up.prometheus import ScrapeTarget, start_prometheus

        # A TP group's follower ranks serve no metrics (their leader, a prefill or decode, reports the group's).
        targets = [ScrapeTarget(child.role, child.address("metrics_port")) for child in ready
                   if "metrics_port" in child.ready_info]
        testbed = self._links.testbed
        run_id = testbed.run_id if testbed is not None else None
        # Blocking (it waits for /-/ready): in a thread, so the children's output keeps being read meanwhile.
        self.prometheus = prometheus = await asyncio.to_thread(start_prometheus, self.run_dir, targets, run_id=run_id)
        self.log(prometheus.announcement())
        self.log(f"kvtransit up: Prometheus at {prometheus.url} scraping {len(targets)} targets "
                 f"(it stops with the run)")

    def _stop_prometheus(self) -> None:
        if self.prometheus is not None:
            self.prometheus.stop()

    def _annotate_report(self) -> None:
        """Join what only the launcher knows (the links' back-ends, Prometheus's URL) into the report."""
        if not self.report_path.exists():
            return
        import json

        from kvtransit.report.build import annotate_report, write_report
        from kvtransit.twin.diff import attach_twin

        report = json.loads(self.report_path.read_text())
        annotate_report(report, links=self.link_setup.describe() if self.link_setup else None,
                        prometheus_url=self.prometheus.url if self.prometheus is not None else None)
        # Every live run beside its twin, request by request (twin/diff.py); a front end's requests came from outside
        # clients, which the twin cannot replay.
        if self.frontend is None:
            started = time.perf_counter()
            attach_twin(report, self.scenario)
            report["twin"]["wall_s"] = time.perf_counter() - started
        else:
            report["twin"] = {"refused": "the requests came from outside clients (--frontend): none to replay"}
        # The figures are drawn here, in the harness, not in the load generator (a serving process: its memory
        # is the run's), from the report it wrote.
        write_report(report, self.report_path, figures=self.figures)

    async def _progress(self, loadgen: Child, decodes: list[Child]) -> None:
        while True:
            await asyncio.sleep(0.5)
            try:
                snapshot = await get_json(loadgen.host, loadgen.ready_info["metrics_port"], "/stats", timeout_s=2.0)
                link_bytes = 0.0
                busy = 0.0
                for decode in decodes:
                    stats = await get_json(decode.host, decode.ready_info["metrics_port"], "/stats", timeout_s=2.0)
                    link_bytes += stats["link"]["wire_bytes"]
                    busy += stats["link"]["busy_s"]
            except (TimeoutError, OSError, ConnectionError, ValueError, KeyError):
                continue
            snapshot["link_Bps"] = (link_bytes / busy / self.scenario.effective_scale * self.scenario.effective_dilation
                                    if busy else None)
            if self.on_progress is not None:
                self.on_progress(snapshot)

    async def run(self, stop: asyncio.Event | None = None) -> Path | None:
        """Run to the end (or until `stop`); returns the report path if one was written. Raises RunFailed."""
        stop = stop or asyncio.Event()
        scenario = self.scenario
        if self.want_prometheus:
            from kvtransit.harness.up.prometheus import config_source_dir, find_prometheus

            find_prometheus()  # missing: a one-line error with the install hint, before anything starts
            config_source_dir()
        self._check_flows()  # every flow's refusals and the host's room: one line each, before anything starts
        self.run_dir.mkdir(parents=True, exist_ok=True)
        # Blocking ip/tc calls (well under a second); nothing else runs yet.
        self.link_setup = choose_links(scenario, self.links_mode, manifest_path=self.run_dir / "links.json")
        self.log(self.link_setup.summary())
        for note in self.link_setup.notes:
            self.log(f"links: {note}")
        try:
            try:
                # Downstream first, so every process knows its peers' ports before it dials them; each flow's
                # processes beside an instance start before it, its own roles once the roles they follow are up.
                decode_children = []
                for i in range(scenario.decode):
                    decode_children.append(self._child(f"decode-{i}", "decode",
                                                       self._command("decode", i, *await self._before("decode", i))))
                    await self._start(decode_children[-1])
                await self._after("decode")
                middlebox_child = self._child("middlebox-0", "middlebox", self._command(
                    "middlebox", 0, *await self._before("middlebox", 0),
                    decode_kv=_addresses(decode_children, "listen_port")))
                await self._start(middlebox_child)
                await self._after("middlebox")
                # A fault tool needs this while the run is on (toxiproxy clients, Chaos Toolkit: toxiproxy_api.py).
                self.log(f"kvtransit up: middlebox control API at http://{middlebox_child.address('control_port')} "
                         "(also toxiproxy's API: /proxies, /reset)")
                prefill_children = []
                for i in range(scenario.prefill):
                    prefill_children.append(self._child(f"prefill-{i}", "prefill", self._command(
                        "prefill", i, *await self._before("prefill", i),
                        middlebox_kv=_addresses([middlebox_child], "listen_port"))))
                    await self._start(prefill_children[-1])
                await self._after("prefill")
                client = "frontend" if self.frontend is not None else "loadgen"
                loadgen_child = self._child(f"{client}-0", client, self._command(
                    client, prefills=_addresses(prefill_children, "listen_port"),
                    decode_clients=_addresses(decode_children, "client_port"),
                    stats=_addresses(self._stats_children(), "metrics_port")))
                await self._start(loadgen_child)
                if self.frontend is not None:
                    self._announce_frontend(loadgen_child)
                if self.want_prometheus:
                    await self._start_prometheus(self.children)
                progress = asyncio.create_task(self._progress(loadgen_child, decode_children))
                try:
                    await self._supervise(loadgen_child, stop)
                    if self.prometheus is not None and self.crashed is None and not stop.is_set():
                        await self._linger(stop)
                finally:
                    progress.cancel()
                    await asyncio.gather(progress, return_exceptions=True)
            finally:
                await self.stop_all()
                self._stop_prometheus()
        except BaseException:
            self._cleanup_links(failing=True)
            raise
        self._cleanup_links(failing=False)
        self._annotate_report()
        if self.crashed is not None:
            raise RunFailed(self.crashed.describe_exit())
        loadgen_exit = loadgen_child.started.returncode
        if loadgen_exit not in (0, -signal.SIGTERM) and not self.report_path.exists():
            raise RunFailed(loadgen_child.describe_exit())
        return self.report_path if self.report_path.exists() else None

    def _stats_children(self) -> list[Child]:
        """The children whose /stats join the report: the core's serving roles', and those a flow names."""
        roles = {*STATS_ROLES, *(role for launch in self.launches for role in launch.STATS_ROLES)}
        return [child for child in self.children if child.role in roles]

    def _announce_frontend(self, child: Child) -> None:
        assert self.frontend is not None  # called only with a front end
        self.frontend_url = f"http://{child.host}:{child.ready_info['openai_port']}/v1"
        ends = [f"after {self.frontend.max_requests} requests" if self.frontend.max_requests else "",
                f"after {self.frontend.duration_s:g} s" if self.frontend.duration_s else "", "on Ctrl-C"]
        self.log(f"kvtransit up: OpenAI-compatible front end at {self.frontend_url} (model "
                 f"{self.frontend.served_model or self.scenario.model}); the run ends "
                 f"{' or '.join(e for e in ends if e)}")

    async def _linger(self, stop: asyncio.Event) -> None:
        """Keep the agents (and Prometheus) up a couple of scrape intervals after the load generator is done."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(PROMETHEUS_LINGER_SCRAPES * PROMETHEUS_SCRAPE_INTERVAL_S):
                await stop.wait()

    def _cleanup_links(self, *, failing: bool) -> None:
        """Every namespace, veth and qdisc of the run, by exact name. A failure here is loud and says how to
        finish the job; on the way out of another failure it must not hide that one."""
        setup = self.link_setup
        if setup is None:
            return
        try:
            setup.cleanup()
        except Exception as exc:
            message = f"kvtransit up: removing the run's network namespaces failed: {exc}; {setup.clean_hint()}"
            if failing:
                self.log(message)
            else:
                raise RunFailed(message) from exc
        else:
            if failing and setup.manifest_path is not None:
                self.log(f"kvtransit up: the run's namespaces and veths were removed ({setup.clean_hint()})")

    def current(self, role: str) -> Child:
        """The live (latest) child of a role: a restarted child replaces the one that died."""
        return [c for c in self.children if c.role == role][-1]

    async def _restart(self, child: Child) -> Child:
        exited_at = time.monotonic()
        fresh = Child(child.name, child.role, pinned_argv(child.argv, child.ready_info), host=child.host,
                      kv_host=child.kv_host)
        self.log(f"kvtransit up: {child.describe_exit()}\nkvtransit up: restarting {child.name} on the same ports")
        await self._start(fresh)
        self.restarts.append({"name": child.name, "exited_at": exited_at, "ready_at": time.monotonic()})
        return fresh

    async def _supervise(self, loadgen: Child, stop: asyncio.Event) -> None:
        """Until the load generator exits: a child of `restart_roles` that exits is restarted on its ports, any
        other exit is a crash; `stop` ends the run early."""
        waits = {asyncio.create_task(c.started.wait()): c for c in self.children}
        stopper = asyncio.create_task(stop.wait())
        try:
            while True:
                done, _ = await asyncio.wait([*waits, stopper], return_when=asyncio.FIRST_COMPLETED)
                if stopper in done:
                    return
                for task in done:
                    child = waits.pop(task)
                    if child is loadgen:
                        return
                    if child.role in self.group_roles and not stop.is_set():
                        # A flow's group process (a TP rank or switch, a ring rank): its leader finds the group
                        # failed and fails every request it takes with the reason, so the run goes on, accounted.
                        self.group_losses.append(child.name)
                        self.log(f"kvtransit up: {child.describe_exit()}\nkvtransit up: its group has failed; its "
                                 "prefill or decode fails the requests it takes with the reason")
                        continue
                    restarted = sum(1 for r in self.restarts if r["name"] == child.name)
                    if child.role in self.restart_roles and restarted < MAX_RESTARTS and not stop.is_set():
                        fresh = await self._restart(child)
                        waits[asyncio.create_task(fresh.started.wait())] = fresh
                        continue
                    self.crashed = child
                    self.log(f"kvtransit up: {child.describe_exit()}\nkvtransit up: stopping the run; the report "
                             "will hold what completed")
                    return
        finally:
            stopper.cancel()
            for task in waits:
                task.cancel()


def _addresses(children: list[Child], port_key: str) -> str:
    return ",".join(child.address(port_key) for child in children)
