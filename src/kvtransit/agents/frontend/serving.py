"""The front end's HTTP side: OpenAI's routes on the house HTTP server, answered whole or as server-sent events.

    GET  /v1/models             the served model (the scenario's), with its context
    POST /v1/completions        a testbed request per HTTP request; `stream: true` answers token by token
    POST /v1/chat/completions   the same, in chat's shape
    GET  /health                200 once the port is open (vLLM's readiness probe, which tools poll)

Connections are persistent (HTTP/1.1 keep-alive, runtime/http.py), as against vLLM. A request is stamped when its
first byte arrives, on the testbed's clock: that is its arrival, where its TTFT starts. It is parsed by
`openai_protocol` (pure), handed to the testbed (`Testbed.submit`: bridge.py) and answered from the tokens it
delivers: a streamed chunk is written the moment its token reached the front end, so what a client measures is
the emulated TTFT and ITL. The completion routes are registered `cancel_on_disconnect`: a client that closes the
connection mid-answer cancels its handler, which tells the testbed the client is gone (`Testbed.cancel`: the
ledger's reason "client gone").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Protocol

from kvtransit.agents.frontend import openai_protocol as api
from kvtransit.agents.frontend.openai_protocol import Job, Limits, OpenAIError, TokenCounter
from kvtransit.model.judge.slo import RequestRecord
from kvtransit.runtime.clock import Clock
from kvtransit.runtime.http import HttpRequest, HttpResponse, HttpServer, HttpStream

# A 32,768-token prompt is ~128 KiB of text or ~230 KiB as a JSON list of token ids; 8 MiB bounds a bad client
# with room for long chat histories.
MAX_BODY_BYTES = 8 * 1024 * 1024


class RunOver(Exception):
    """The run takes no more requests (its request count was reached, or it is stopping)."""


@dataclass
class Admission:
    """A request the testbed took: its tokens' indices arrive on `events` as they are delivered, then None
    when it is over (`record` then says how: finished, failed with a reason, or timed out)."""

    request_id: int
    record: RequestRecord
    events: asyncio.Queue[int | None] = field(default_factory=asyncio.Queue)


class Testbed(Protocol):
    """What the HTTP side needs of the testbed (bridge.py: FrontendGenerator)."""

    clock: Clock

    async def submit(self, prompt_tokens: int, output_tokens: int, arrival_ns: int) -> Admission: ...

    def cancel(self, request_id: int) -> None: ...


def why_not_finished(record: RequestRecord) -> str:
    if record.failure:
        return record.failure
    if record.timed_out:
        return "timed out: the run ended before it finished"
    return "ended early"


class OpenAIServer:
    def __init__(self, testbed: Testbed, counter: TokenCounter, limits: Limits, *, name: str,
                 on_response: Callable[[str, int], None] | None = None):
        """`on_response(route, status)` counts every answer (the agent's metrics)."""
        self.testbed = testbed
        self.counter = counter
        self.limits = limits
        self.name = name
        self.on_response = on_response or (lambda _route, _status: None)
        # Persistent connections, as vLLM's server keeps them: a tool's pool reuses one, so no TCP connect lands
        # in its TTFT. Requests are stamped on the testbed's clock when their first byte arrives (arrived_ns).
        self.http = HttpServer(max_body_bytes=MAX_BODY_BYTES, error_body=api.http_error_body, keep_alive=True,
                               now_ns=lambda: self.testbed.clock.now_ns())
        self.http.route("GET", "/v1/models", self._models, public=True)
        self.http.route("GET", "/health", self._health, public=True)
        self.http.route("POST", "/v1/completions", self._completions, public=True, cancel_on_disconnect=True)
        self.http.route("POST", "/v1/chat/completions", self._chat, public=True, cancel_on_disconnect=True)

    @property
    def port(self) -> int:
        return self.http.port

    async def start(self, host: str, port: int) -> None:
        await self.http.start(host, port)

    async def close(self) -> None:
        await self.http.close()

    # -- routes ------------------------------------------------------------------------------------------------

    async def _models(self, _request: HttpRequest) -> HttpResponse:
        return self._json("/v1/models", api.models_body(self.limits, _created()))

    async def _health(self, _request: HttpRequest) -> HttpResponse:
        return HttpResponse(200, b"", "text/plain")

    async def _completions(self, request: HttpRequest) -> HttpResponse | HttpStream:
        return await self._answer("/v1/completions", request, api.parse_completion)

    async def _chat(self, request: HttpRequest) -> HttpResponse | HttpStream:
        return await self._answer("/v1/chat/completions", request, api.parse_chat)

    # -- one request -------------------------------------------------------------------------------------------

    async def _answer(self, route: str, request: HttpRequest,
                      parse: Callable[[bytes, TokenCounter, Limits], Job]) -> HttpResponse | HttpStream:
        # Its TTFT starts when its first byte arrived, so receiving the body, parsing and tokenizing it count in it,
        # as they do in vLLM's and in a load tool's (a tool's clock starts before it sends).
        arrival_ns = request.arrived_ns
        try:
            job = parse(request.body, self.counter, self.limits)
        except OpenAIError as exc:
            return self._error(route, exc)
        try:
            admission = await self.testbed.submit(job.prompt_tokens, job.max_tokens, arrival_ns)
        except RunOver as exc:
            return self._error(route, OpenAIError(503, f"the run takes no more requests: {exc}",
                                                  error_type="service_unavailable_error", code="run_over"))
        prefix = "chatcmpl" if job.kind == "chat" else "cmpl"
        response_id = f"{prefix}-{self.name}-{admission.request_id}"
        if job.stream:
            self.on_response(route, 200)
            return HttpStream(self._stream(job, admission, response_id))
        return await self._whole(route, job, admission, response_id)

    async def _whole(self, route: str, job: Job, admission: Admission, response_id: str) -> HttpResponse:
        """Wait for every token, then answer at once (or with why the testbed did not finish it)."""
        delivered = 0
        try:
            while await admission.events.get() is not None:
                delivered += 1
        except asyncio.CancelledError:  # the client closed the connection (cancel_on_disconnect)
            self.testbed.cancel(admission.request_id)
            raise
        record = admission.record
        if not record.finished:
            return self._error(route, _not_finished(record))
        return self._json(route, api.response_body(job, response_id, _created(), delivered))

    async def _stream(self, job: Job, admission: Admission, response_id: str) -> AsyncGenerator[bytes, None]:
        """One event per token as it arrives; then the usage (if asked) or the error; then [DONE]. Left before
        the end (the client closed the connection: cancelled, or closed by the server), the request is
        cancelled: the client is gone."""
        created = _created()
        delivered = 0
        complete = False
        try:
            while (index := await admission.events.get()) is not None:
                yield api.sse(api.token_chunk(job, response_id, created, index))
                delivered += 1
            record = admission.record
            if record.finished:
                if job.include_usage:
                    yield api.sse(api.usage_chunk(job, response_id, created, delivered))
            else:  # the status line went out with the first byte: the error travels as an event, as vLLM sends it
                yield api.sse(_not_finished(record).body())
            yield api.SSE_DONE
            complete = True
        finally:
            if not complete:
                self.testbed.cancel(admission.request_id)

    # -- answers -----------------------------------------------------------------------------------------------

    def _json(self, route: str, body: dict, status: int = 200) -> HttpResponse:
        self.on_response(route, status)
        return HttpResponse.json(body, status)

    def _error(self, route: str, error: OpenAIError) -> HttpResponse:
        return self._json(route, error.body(), error.status)


def _not_finished(record: RequestRecord) -> OpenAIError:
    """A request the testbed failed (500, with its reason) or did not finish before the run ended (503)."""
    if record.timed_out and not record.failure:
        return OpenAIError(503, f"the testbed did not finish the request: {why_not_finished(record)}",
                           error_type="service_unavailable_error", code="run_over")
    return OpenAIError(500, f"the testbed failed the request: {why_not_finished(record)}", error_type="server_error")


def _created() -> int:
    """The API's `created` field: Unix seconds, a label for the client (no duration is measured with it)."""
    return int(time.time())
