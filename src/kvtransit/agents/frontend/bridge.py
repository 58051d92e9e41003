"""The front end's bridge to the testbed: a load generator whose requests come from outside (`kvtransit frontend`).

`FrontendGenerator` is the load generator (agents/loadgen/agent.py) with its send schedule replaced: each HTTP
request that `serving.OpenAIServer` parsed is `submit`ted as a testbed request (prompt tokens as counted, output
tokens = max_tokens) through the same router, prefill and decode connections, records, ledger and report; its
tokens are handed back, one by one as they arrive (`Admission.events`). Everything the load generator measures
and writes (the ledger's sent/tokens/outcome lines, the run report, the Prometheus series) covers these
requests as it covers a drawn workload's.

How a run ends (whichever comes first):
- `max_requests` (> 0) requests were taken: later ones are refused (503, `run_over`); the run then waits for
  those in flight (the drain allowance) and reports;
- `duration_s` (> 0) wall seconds passed since the run started taking requests;
- it is stopped (SIGINT/SIGTERM, `kvtransit up`'s Ctrl-C): requests still in flight are timed out, their clients
  told so, and the report covers everything served.
With neither limit it serves until stopped, as an inference server does.

A client that goes away mid-answer is `cancel`led: the request fails with the reason "client gone" (ledger and
report, once), and is withdrawn from the testbed (`LoadGenerator.withdraw`: an Error naming it to its prefill and
decode), which drop it from the queue, release its KV and make no more tokens for it. A token already on its way
when it was withdrawn still arrives, and is counted as the ledger's `late_tokens` and dropped.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from kvtransit.agents.frontend.openai_protocol import Limits, TokenCounter
from kvtransit.agents.frontend.serving import Admission, OpenAIServer, RunOver
from kvtransit.agents.loadgen.agent import LoadGenerator
from kvtransit.agents.loadgen.ledger_writer import LedgerWriter
from kvtransit.agents.process import Address, announce_ready, port_in_use_error, start_http
from kvtransit.model.judge.slo import RequestRecord
from kvtransit.model.scenario import Scenario
from kvtransit.model.serving.workload import RequestSpec
from kvtransit.runtime import metrics as runtime_metrics
from kvtransit.runtime.clock import Clock
from kvtransit.runtime.transport import Endpoint
from kvtransit.wire.events import Role

CLIENT_GONE = "client gone"  # the ledger's and the report's failure reason for an abandoned request


class FrontendGenerator(LoadGenerator):
    def __init__(self, scenario: Scenario, *, name: str, prefills: list[Address], decodes: list[Address],
                 metrics_listen: Address, openai_listen: Address, counter: TokenCounter,
                 served_model: str | None = None, max_requests: int = 0, duration_s: float = 0.0,
                 stats_from: list[Address] | None = None, report_path: Path | None = None,
                 drain_timeout_s: float | None = None, ledger_path: Path | None = None, clock: Clock | None = None):
        """`served_model`: the name clients ask for (default: the scenario's model). `max_requests`,
        `duration_s`: when the run ends (module docstring; 0 = no such limit)."""
        if max_requests < 0 or duration_s < 0:
            raise ValueError(f"max_requests and duration_s must be >= 0 (0: no limit), got {max_requests}, "
                             f"{duration_s}")
        super().__init__(scenario, name=name, prefills=prefills, decodes=decodes, metrics_listen=metrics_listen,
                         stats_from=stats_from or [], report_path=report_path, drain_timeout_s=drain_timeout_s,
                         ledger_path=ledger_path, clock=clock)
        self.workload = []  # filled as requests arrive: the report's offered load is what clients sent
        self.openai_listen = openai_listen
        self.max_requests = max_requests
        self.duration_s = duration_s
        self.counter = counter
        self.limits = Limits((served_model or scenario.model,), scenario.context_cap)
        # Answers by "ROUTE STATUS", in /stats and the report, and as kvtransit_frontend_responses_total.
        self.response_counts: dict[str, int] = {}
        self.frontend_metrics = runtime_metrics.frontend_metrics(self.registry)
        self.server = OpenAIServer(self, counter, self.limits, name=name, on_response=self._count_response)
        self.client_gone = 0
        self._prefills: list[Endpoint] = []
        self._taking = asyncio.Event()  # the run has started: requests may be sent
        self._closed = False  # no more requests are taken
        self._over = asyncio.Event()  # an end condition was met
        self._admissions: dict[int, Admission] = {}

    # -- what the HTTP side calls --------------------------------------------------------------------------------

    async def submit(self, prompt_tokens: int, output_tokens: int, arrival_ns: int) -> Admission:
        """Send a request for `prompt_tokens` and `output_tokens` that arrived at `arrival_ns` (the injected
        clock); RunOver once the run takes no more."""
        if not self._closed:
            await self._taking.wait()  # the port opens a moment before the run starts
        if self._closed:
            raise RunOver(f"it took its {self.max_requests} requests" if self._count_reached() else "it is ending")
        request_id = len(self.workload)
        spec = RequestSpec(request_id, self._model_s(arrival_ns), prompt_tokens, output_tokens)
        self.workload.append(spec)
        if self._count_reached():
            self._closed = True  # taken before the send below yields, so no request slips past the count
        await self.send_request(self._prefills, spec, arrival_ns=arrival_ns)
        admission = Admission(request_id, self.records[request_id])
        if request_id in self._open:
            self._admissions[request_id] = admission
        else:  # failed while being sent: over already
            admission.events.put_nowait(None)
        if self._count_reached():
            self._over.set()
        return admission

    def cancel(self, request_id: int) -> None:
        """The client went away before its answer was complete: the request fails as "client gone"."""
        if request_id in self._open:
            self.client_gone += 1
            self.withdraw(request_id, CLIENT_GONE)

    def _count_reached(self) -> bool:
        return bool(self.max_requests) and len(self.workload) >= self.max_requests

    # -- the load generator's hooks --------------------------------------------------------------------------------

    async def _dispatch(self, prefills: list[Endpoint]) -> None:
        """Take requests from outside until an end condition (module docstring), then let the run drain."""
        self._prefills = prefills
        self._taking.set()
        try:
            if self.duration_s:
                # The run's length as the operator set it, in wall seconds: no model time, so the loop's timer.
                async with asyncio.timeout(self.duration_s):
                    await self._over.wait()
            else:
                await self._over.wait()
        except TimeoutError:
            pass
        finally:
            self._closed = True
        self._all_sent = True
        if not self._open:
            self._done.set()

    def _on_token(self, record: RequestRecord, index: int) -> None:
        admission = self._admissions.get(record.request_id)
        if admission is not None:
            admission.events.put_nowait(index)

    def _on_settled(self, record: RequestRecord) -> None:
        admission = self._admissions.pop(record.request_id, None)
        if admission is not None:
            admission.events.put_nowait(None)

    def _count_response(self, route: str, status: int) -> None:
        key = f"{route} {status}"
        self.response_counts[key] = self.response_counts.get(key, 0) + 1
        self.frontend_metrics.responses.labels(route=route, status=str(status)).inc()

    def frontend_stats(self) -> dict:
        return {"url": f"http://{self.openai_listen.host}:{self.server.port}/v1", "served_model": self.limits.models[0],
                "context_tokens": self.limits.context_tokens, "tokenizer": self.counter.name,
                "max_requests": self.max_requests, "duration_s": self.duration_s, "requests": len(self.workload),
                "client_gone": self.client_gone, "responses": dict(sorted(self.response_counts.items()))}

    def snapshot(self) -> dict:
        return {**super().snapshot(), "frontend": self.frontend_stats()}

    def _amend_report(self, report: dict) -> None:
        """The workload was what clients sent: say so (the drawn workload's description would be wrong)."""
        offered = (report.get("workload") or {}).get("offered_vs_capacity")
        report["workload"] = {"source": "openai-frontend", "requests": len(self.workload),
                              "served_model": self.limits.models[0], "tokenizer": self.counter.name,
                              "offered_vs_capacity": offered}
        report["frontend"] = self.frontend_stats()

    # -- the process -----------------------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event | None = None) -> dict:
        """As the load generator's run, with the OpenAI port open (on the readiness line as `openai_port`)."""
        stop = stop or asyncio.Event()
        http = await start_http(self.metrics_listen, self.registry, self.snapshot)
        try:
            await self.server.start(self.openai_listen.host, self.openai_listen.port)
        except OSError as exc:
            await http.close()
            raise port_in_use_error(self.openai_listen, "--openai-listen", exc) from None
        prefills: list[Endpoint] = []
        decodes: list[Endpoint] = []
        try:
            if self.ledger_path is not None:
                self.ledger = LedgerWriter(self.ledger_path, clock=self.clock)
            prefills = [await self._connect(a, Role.PREFILL) for a in self.prefill_addresses]
            decodes = [await self._connect(a, Role.DECODE) for a in self.decode_addresses]
            announce_ready("frontend", self.name, metrics_port=http.port, openai_port=self.server.port)
            run_wall_s = await self.drive(prefills, decodes, stop)
            return await self._build_report(run_wall_s)
        finally:
            self._closed = True
            for endpoint in [*prefills, *decodes]:
                endpoint.abort()
            await self.server.close()
            await http.close()
