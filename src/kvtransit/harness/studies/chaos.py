"""`kvtransit chaos`: named faults against a live testbed, judged by the request ledger.

Each scenario runs one short serving run (the Launcher with its supervisor on: the real processes, a middlebox
or decode that dies is restarted on the same ports), injects its fault a couple of seconds in, lets the run finish,
then checks the load generator's ledger (`model.ledger_check.check`): lost, duplicated, cross-delivered, corrupted
must be 0 and every failure must carry a reason. Recovery time is from the end of the fault (for a kill:
the kill) to the first hand-off that reached decode after it (and after the restarted process was up).

Faults come from three places: the middlebox's fault stages through its control API (`/faults/NAME`),
the process (signals by pid: kill -9, SIGTERM + the supervisor's restart, SIGSTOP/SIGCONT), and, in netns
mode, the shaped link itself (`Testbed.down/up`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kvtransit.harness.children import Child
from kvtransit.harness.up.launcher import Launcher, RunFailed
from kvtransit.harness.up.placement import DECODE_NS, MIDDLEBOX_NS
from kvtransit.harness.up.supervisor import RESTARTABLE_ROLES
from kvtransit.model.judge import ledger_check as ledger_model
from kvtransit.model.scenario import Scenario
from kvtransit.runtime import http_client
from kvtransit.wire import Connection, FrameType, pack_header
from kvtransit.wire.events import DType, Hello, Role
from kvtransit.wire.limits import MAX_PAYLOAD, WIRE_VERSION

# When the fault starts, after every agent is ready: the load has been flowing for a while by then.
FAULT_AT_S = 2.0
# How long a timed fault stays on ("link down 2 s then up").
FAULT_FOR_S = 2.0
# RSS is sampled this often from /proc for the prefill and the middlebox.
RSS_POLL_S = 0.1
# A short, light run per scenario, so the whole suite fits a few minutes on a 2-core box.
DEFAULT_REQUESTS = 30
DEFAULT_RATE = 4.0
# Stragglers: model seconds after the last arrival before the load generator times requests out. Above the
# prefill's hand-off deadline would be safest, but a scenario must end: chaos runs shorten that deadline to
# HANDOFF_DEADLINE_S (the env var the prefill reads), so every request ends before the drain does.
DRAIN_TIMEOUT_S = 20.0
HANDOFF_DEADLINE_S = 12.0


def rss_bytes(pid: int) -> int | None:
    """Resident set size of a process, from /proc (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


@dataclass
class ChaosContext:
    """What a fault needs: the live processes, the middlebox's control API, the testbed (netns mode)."""

    launcher: Launcher
    token: str | None = None
    notes: list[str] = field(default_factory=list)
    checks: dict = field(default_factory=dict)  # scenario-specific findings (must all be true)
    # checks on the agents' own counts after the run (peer_counts): the fault really did something
    expect: dict = field(default_factory=dict)

    def child(self, role: str) -> Child:
        return self.launcher.current(role)

    @property
    def control(self) -> tuple[str, int]:
        middlebox = self.child("middlebox")
        return middlebox.host, middlebox.ready_info["control_port"]

    async def control_call(self, method: str, path: str, body=None, raw: bytes | None = None) -> tuple[int, bytes]:
        data = raw if raw is not None else (http_client.json_body(body) if body is not None else None)
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else None
        answer = await http_client.request(*self.control, method, path, data, headers=headers)
        return answer.status, answer.body

    async def put_fault(self, name: str, body: dict) -> None:
        status, answer = await self.control_call("PUT", f"/faults/{name}", body)
        if status != 200:
            raise RuntimeError(f"PUT /faults/{name} answered {status}: {answer[:200]!r}")

    async def delete_fault(self, name: str) -> None:
        status, answer = await self.control_call("DELETE", f"/faults/{name}")
        if status != 200:
            raise RuntimeError(f"DELETE /faults/{name} answered {status}: {answer[:200]!r}")

    async def timed_fault(self, name: str, body: dict, seconds: float = FAULT_FOR_S) -> float:
        await self.put_fault(name, body)
        await asyncio.sleep(seconds)
        await self.delete_fault(name)
        return time.monotonic()

    def signal(self, role: str, sig: signal.Signals) -> None:
        os.kill(self.child(role).started.pid, sig)

    @property
    def testbed(self):
        setup = self.launcher.link_setup
        return setup.testbed if setup is not None else None


Inject = Callable[[ChaosContext], Awaitable[float]]  # returns when the fault ended (monotonic seconds)


@dataclass(frozen=True)
class FaultPlan:
    name: str
    description: str
    inject: Inject
    # The prefill's hand-off deadline in this scenario's run (model seconds; see HANDOFF_DEADLINE_S).
    handoff_deadline_s: float = HANDOFF_DEADLINE_S


async def _kill_middlebox(ctx: ChaosContext) -> float:
    # Mid-transfer: wait (briefly) until a hand-off is open in the middlebox, then kill -9.
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        status, body = await ctx.control_call("GET", "/stats")
        if status == 200 and json.loads(body).get("open_handoffs", 0) > 0:
            break
        await asyncio.sleep(0.01)
    ctx.signal("middlebox", signal.SIGKILL)
    ctx.expect["hand-offs were sent again"] = lambda peers: peers["retries"] > 0
    return time.monotonic()


async def _restart_decode(ctx: ChaosContext) -> float:
    ctx.signal("decode", signal.SIGTERM)
    return time.monotonic()


async def _kill_decode(ctx: ChaosContext) -> float:
    # The requests decode was running die with it: the client fails them, naming the lost connection; the
    # hand-offs not yet acked go again to the restarted decode.
    ctx.signal("decode", signal.SIGKILL)
    return time.monotonic()


async def _link_down(ctx: ChaosContext) -> float:
    bed = ctx.testbed
    if bed is None:  # loopback: the middlebox's writes to decode stop, then resume (TCP would retransmit)
        ctx.notes.append("loopback: link down emulated by the middlebox's timeout fault (writes hang)")
        return await ctx.timed_fault("link-down", {"type": "timeout", "timeout_s": 0})
    await asyncio.to_thread(bed.down, MIDDLEBOX_NS, DECODE_NS)
    try:
        await asyncio.sleep(FAULT_FOR_S)
    finally:
        await asyncio.to_thread(bed.up, MIDDLEBOX_NS, DECODE_NS)
    return time.monotonic()


def _scaled_rate(ctx: ChaosContext) -> float:
    return ctx.launcher.scenario.scaled_link.bandwidth_Bps


async def _rate_collapse(ctx: ChaosContext) -> float:
    # To 2 % of the link's rate (a congested or renegotiated link), for the fault's duration.
    bed = ctx.testbed
    link = bed.link(MIDDLEBOX_NS, DECODE_NS) if bed is not None else None
    if link is None or link.spec is None or link.spec.rate_Bps is None:
        return await ctx.timed_fault("rate-collapse", {"type": "bandwidth", "rate_Bps": _scaled_rate(ctx) * 0.02})
    spec = link.spec  # netns: tc itself retunes the shaped veth, then puts it back
    collapsed = dataclasses.replace(spec, rate_Bps=spec.rate_Bps * 0.02)
    await asyncio.to_thread(bed.change, MIDDLEBOX_NS, DECODE_NS, collapsed)
    try:
        await asyncio.sleep(FAULT_FOR_S)
    finally:
        await asyncio.to_thread(bed.change, MIDDLEBOX_NS, DECODE_NS, spec)
    return time.monotonic()


async def _corrupt(ctx: ChaosContext) -> float:
    await ctx.put_fault("corrupt", {"type": "corrupt", "probability": 0.3, "seed": 7})
    await asyncio.sleep(FAULT_FOR_S)
    status, body = await ctx.control_call("GET", "/faults")
    await ctx.delete_fault("corrupt")
    flipped = sum(f.get("corrupted", 0) for f in json.loads(body)) if status == 200 else 0
    ctx.checks["payload bits were flipped on the wire"] = flipped > 0
    ctx.expect["decode dropped the corrupted streams"] = lambda peers: peers["kv_aborted"] > 0
    return time.monotonic()


async def _reset_peer(ctx: ChaosContext) -> float:
    ctx.expect["hand-offs were sent again"] = lambda peers: peers["retries"] > 0
    return await ctx.timed_fault("reset", {"type": "reset_peer", "after_bytes": 256 * 1024}, seconds=1.0)


async def _loss(ctx: ChaosContext) -> float:
    ctx.expect["hand-offs were sent again"] = lambda peers: peers["retries"] > 0
    return await ctx.timed_fault("loss", {"type": "limit_data", "bytes": 1 << 20})


async def _latency(ctx: ChaosContext) -> float:
    return await ctx.timed_fault("latency", {"type": "latency", "latency_s": 0.02, "jitter_s": 0.01})


async def _slicer(ctx: ChaosContext) -> float:
    return await ctx.timed_fault("slicer", {"type": "slicer", "average_bytes": 1500, "size_variation_bytes": 1000})


async def _slow_decode(ctx: ChaosContext) -> float:
    # A decode that stops reading (SIGSTOP: its kernel still ACKs what fits its socket buffers, then TCP's
    # window closes): back-pressure must reach the middlebox and the prefill without their memory growing.
    ctx.signal("decode", signal.SIGSTOP)
    try:
        await asyncio.sleep(FAULT_FOR_S + 1.0)
    finally:
        ctx.signal("decode", signal.SIGCONT)
    return time.monotonic()


def oversized_chunk_header() -> bytes:
    """A KvChunk header with a valid header CRC that announces a payload over MAX_PAYLOAD: a peer must drop us."""
    return pack_header(FrameType.KV_CHUNK, request_id=1, dtype=DType.BF16, shape=(8,), meta_length=8,
                       payload_length=MAX_PAYLOAD + 1)


async def _rogue(host: str, port: int, role: Role, their_role: Role, payload: bytes, timeout_s: float = 5.0) -> bool:
    """Send Hello then `payload`; True when the peer closed the connection on us (with or without an Error)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(Connection(role, their_role).send(Hello(role=role, version=WIRE_VERSION, name="rogue")) + payload)
        await writer.drain()
        while True:
            async with asyncio.timeout(timeout_s):
                if not await reader.read(65536):
                    break
        return True  # EOF: the peer dropped us
    except (ConnectionError, OSError):
        return True
    except TimeoutError:
        return False
    finally:
        writer.close()


async def _malformed_peer(ctx: ChaosContext) -> float:
    prefill, middlebox, decode = ctx.child("prefill"), ctx.child("middlebox"), ctx.child("decode")
    targets = {"prefill": (prefill.host, prefill.ready_info["listen_port"], Role.LOADGEN, Role.PREFILL),
               "middlebox": (middlebox.host, middlebox.ready_info["listen_port"], Role.PREFILL, Role.MIDDLEBOX),
               "decode": (decode.kv_host, decode.ready_info["listen_port"], Role.MIDDLEBOX, Role.DECODE)}
    garbage = bytes(range(256)) * 64
    for target, (host, port, role, their) in targets.items():
        ctx.checks[f"{target} drops a peer sending garbage"] = await _rogue(host, port, role, their, garbage)
        ctx.checks[f"{target} drops a peer sending an oversized frame"] = await _rogue(
            host, port, role, their, oversized_chunk_header())
    return time.monotonic()


async def _control_abuse(ctx: ChaosContext) -> float:
    cases = {
        "bad JSON is a 400": ("PUT", "/kernel", b"{not json", 400),
        "a JSON array is a 400": ("PUT", "/link", b"[1, 2]", 400),
        "an unknown kernel is a 400": ("PUT", "/kernel", json.dumps({"codec": "zip"}).encode(), 400),
        "an unknown fault type is a 400": ("PUT", "/faults/x", json.dumps({"type": "meteor"}).encode(), 400),
        "a fault parameter out of range is a 400": ("PUT", "/faults/x",
                                                    json.dumps({"type": "corrupt", "probability": 7}).encode(), 400),
        "deleting a missing fault is a 404": ("DELETE", "/faults/nothing", None, 404),
        "a huge body is a 413": ("PUT", "/kernel", b"{" + b" " * (2 << 20) + b"}", 413),
    }
    for check, (method, path, body, expected) in cases.items():
        try:
            status, _ = await ctx.control_call(method, path, raw=body)
        except (ConnectionError, OSError):  # the server may close before reading a refused huge body
            status = 413 if expected == 413 else 0
        ctx.checks[check] = status == expected
    status, answer = await ctx.control_call("GET", "/chain")
    ctx.checks["the chain is unchanged and served after the abuse"] = status == 200 and b"kernel" in answer
    return time.monotonic()


SCENARIOS: dict[str, FaultPlan] = {plan.name: plan for plan in (
    FaultPlan("middlebox-kill", "kill -9 the middlebox mid-transfer; the supervisor restarts it", _kill_middlebox),
    FaultPlan("decode-restart", "SIGTERM decode; the supervisor restarts it on the same ports", _restart_decode),
    FaultPlan("decode-kill", "kill -9 decode; its running requests fail with a reason, the rest carry on",
              _kill_decode),
    FaultPlan("link-down", "the middlebox -> decode link down 2 s, then up", _link_down),
    FaultPlan("rate-collapse", "the link to decode falls to 2 % of its rate for 2 s", _rate_collapse),
    FaultPlan("corrupt", "flip a payload bit after the CRC in 30 % of KV chunks for 2 s", _corrupt),
    FaultPlan("reset-peer", "reset the connection to decode after 256 KiB, for 1 s", _reset_peer),
    FaultPlan("loss", "drop the connection to decode after 1 MiB, for 2 s", _loss),
    FaultPlan("latency", "20 ms (+-10 ms) on every write to decode, for 2 s", _latency),
    FaultPlan("slicer", "writes to decode cut into ~1500-byte pieces, for 2 s", _slicer),
    FaultPlan("slow-decode", "decode stops reading for 3 s (SIGSTOP): back-pressure, bounded memory", _slow_decode),
    FaultPlan("malformed-peer", "rogue peers send garbage and oversized frames to prefill, middlebox, decode",
              _malformed_peer),
    FaultPlan("control-abuse", "bad JSON, huge bodies, unknown kernels and faults at the control API",
              _control_abuse),
)}


@dataclass
class ChaosResult:
    scenario: str
    verdict: ledger_model.LedgerVerdict
    recovery_s: float | None
    rss_peak_bytes: dict
    rss_before_bytes: dict
    restarts: list
    checks: dict
    notes: list
    peers: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.verdict.ok and all(self.checks.values())

    def as_json(self) -> dict:
        v = self.verdict.summary()
        return {"scenario": self.scenario, "requests": v["requests"], "ok": v["ok"], "slo_miss": v["slo_miss"],
                "failed": v["failed"], "timed_out": v["timed_out"], "lost": v["lost"], "duplicated": v["duplicated"],
                "cross_delivered": v["cross_delivered"], "corrupted": v["corrupted"],
                "failed_without_reason": v["failed_without_reason"], "late_tokens": v["late_tokens"],
                "counter_mismatches": v["counter_mismatches"], "recovery_s": self.recovery_s,
                "rss_peak_bytes": self.rss_peak_bytes, "rss_before_bytes": self.rss_before_bytes,
                "restarts": len(self.restarts), **self.peers, "checks": self.checks, "notes": self.notes,
                "passed": self.passed, "problems": self.verdict.problems()
                + [f"check failed: {name}" for name, ok in self.checks.items() if not ok]}


def chaos_scenario(requests: int = DEFAULT_REQUESTS, rate: float = DEFAULT_RATE, **fields) -> Scenario:
    """The light serving run each fault is tried against: raw KV (codec none), so decode can check every
    request's bytes against what the prefill made (the ledger's corrupted count)."""
    base = dict(codec="none", rate=rate, requests=requests, prompt_mean=512.0, prompt_cv=0.5, output_mean=16.0,
                output_cv=0.5, seed=1)
    return Scenario.build(**{**base, **fields})


async def run_scenario(plan: FaultPlan, workdir: Path, scenario: Scenario, *, links: str = "loopback",
                       log: Callable[[str], None] = lambda _line: None,
                       handoff_deadline_s: float | None = None) -> ChaosResult:
    """Run `plan` against a testbed of its own and judge it by the ledger; `handoff_deadline_s` overrides the
    plan's."""
    report = Path(workdir) / f"{plan.name}.json"
    # The prefill reads its hand-off deadline from the environment: given to this run's children only, so
    # scenarios run side by side (run_scenarios) each keep their own.
    launcher = Launcher(scenario, report_path=report, drain_timeout_s=DRAIN_TIMEOUT_S,
                        accuracy_sample=scenario.requests, log=log, links=links, restart_roles=RESTARTABLE_ROLES,
                        figures=False,  # judged by its ledger: a chaos run's report needs no figures
                        child_env={"KVTRANSIT_HANDOFF_DEADLINE_S": str(
                            plan.handoff_deadline_s if handoff_deadline_s is None else handoff_deadline_s)})
    ctx = ChaosContext(launcher, token=os.environ.get("KVTRANSIT_CONTROL_TOKEN") or None)
    fault: dict = {}
    rss_peak: dict[str, int] = {}
    rss_before: dict[str, int] = {}

    async def sample_rss() -> None:
        while True:
            for role in ("prefill", "middlebox"):
                try:
                    pid = ctx.child(role).pid
                except IndexError:
                    continue
                value = rss_bytes(pid) if pid else None
                if value is not None:
                    rss_peak[role] = max(rss_peak.get(role, 0), value)
                    if "start" not in fault:
                        rss_before[role] = max(rss_before.get(role, 0), value)
            await asyncio.sleep(RSS_POLL_S)

    async def drive() -> None:
        # The load generator's Child only exists once the launcher reaches it (it starts last), so there is no
        # event to wait on until then; a 50 ms poll costs nothing beside a run of seconds.
        while not any(c.role == "loadgen" and c.ready for c in launcher.children):  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        await asyncio.sleep(FAULT_AT_S)
        fault["start"] = time.monotonic()
        fault["end"] = await plan.inject(ctx)

    async def main():
        stop = asyncio.Event()
        tasks = [asyncio.create_task(drive()), asyncio.create_task(sample_rss())]
        try:
            return await launcher.run(stop)
        finally:
            for task in tasks:
                task.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            error = results[0]
            if isinstance(error, BaseException) and not isinstance(error, asyncio.CancelledError):
                ctx.checks[f"fault injected ({type(error).__name__}: {error})"] = False

    try:
        await main()
    except RunFailed as exc:  # a child the supervisor could not bring back: the ledger still says what happened
        ctx.checks[f"the run completed ({str(exc).splitlines()[0][:200]})"] = False
    ledger_path = launcher.run_dir / ledger_model.LEDGER_FILE
    if not ledger_path.exists():
        raise RunFailed(f"chaos scenario {plan.name}: the load generator wrote no ledger ({ledger_path}); "
                        f"{'; '.join(name for name, ok in ctx.checks.items() if not ok)}")
    # A blocking read is fine here: the run is over, nothing else is waiting on the loop.
    with open(ledger_path, encoding="utf-8") as handle:  # noqa: ASYNC230
        records = ledger_model.parse(handle, str(ledger_path))
    verdict = ledger_model.check(records)
    peers = peer_counts(records)
    for check, holds in ctx.expect.items():
        ctx.checks[check] = bool(holds(peers))
    recovery = None
    if "end" in fault:
        # From the end of the fault to the first KV that reached decode after it; after a process fault, after
        # the restarted process was up too (bytes already in flight past a killed middlebox do not count).
        restarted = [r["ready_at"] for r in launcher.restarts if r["exited_at"] >= fault["start"]]
        first = ledger_model.first_after(records, "kv_ready", max([fault["end"], *restarted]))
        recovery = None if first is None else first - fault["end"]
    else:
        ctx.checks.setdefault("the fault was injected before the run ended", False)
    return ChaosResult(plan.name, verdict, recovery, rss_peak, rss_before, launcher.restarts, ctx.checks, ctx.notes,
                       peers)


async def run_scenarios(plans: Sequence[FaultPlan], workdir: Path, scenario: Scenario, *, parallel: int = 1,
                        links: str = "loopback", log: Callable[[str], None] = lambda _line: None,
                        ) -> dict[str, ChaosResult | BaseException]:
    """Each plan on a testbed of its own, up to `parallel` testbeds at once (each its own processes, ports and run
    directory; a fault reaches only its own testbed), by name in `plans`' order; a scenario that could not run at all
    is its exception, the others still run."""
    if parallel < 1:
        raise ValueError(f"parallel must be >= 1, got {parallel}")
    slots = asyncio.Semaphore(parallel)

    async def one(plan: FaultPlan) -> ChaosResult:
        async with slots:
            return await run_scenario(plan, Path(workdir) / plan.name, scenario, links=links, log=log)

    results = await asyncio.gather(*(one(plan) for plan in plans), return_exceptions=True)
    return {plan.name: result for plan, result in zip(plans, results, strict=True)}


def peer_counts(records: list[dict]) -> dict:
    """What the agents counted (their `peer` ledger records): hand-off retries and give-ups at the prefill,
    KV streams taken, dropped as duplicates and aborted at decode."""
    peers = [r for r in records if r["ev"] == "peer"]
    decode = [r.get("kv_handoffs") or {} for r in peers if r.get("role") == "decode"]
    return {"retries": sum(r.get("handoff_retries") or 0 for r in peers if r.get("role") == "prefill"),
            "given_up": sum(r.get("handoffs_given_up") or 0 for r in peers if r.get("role") == "prefill"),
            "kv_duplicates": sum(d.get("duplicate", 0) for d in decode),
            "kv_aborted": sum(d.get("aborted", 0) for d in decode)}


def select(names: list[str]) -> list[FaultPlan]:
    from kvtransit.model.errors import unknown_name

    if not names:
        return list(SCENARIOS.values())
    for name in names:
        if name not in SCENARIOS:
            raise unknown_name("chaos scenario", name, list(SCENARIOS))
    return [SCENARIOS[name] for name in names]
