"""Decode's KV link: each hand-off reassembled from a middlebox's stream, decided on at its KvEnd, and answered.

The wire checks every chunk's CRC32C and the whole request's checksum; a request whose stream breaks is dropped,
never used (its sender holds the KV until acked and sends it again, or gives up and tells the client). What to do
with each whole hand-off (take it, re-ack a duplicate, drop it, refuse it) is the pure
`model.serving.kv_arrival.KvArrivals`'s decision; this module does the I/O. "KV ready" reaches the load generator
as a Tokens entry with token_index 0 stamped at the KvEnd's arrival, before the Ack lets the sender release it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from kvtransit.agents.decode.incoming import Arrived, Incoming
from kvtransit.agents.decode.link_meter import streamed_idle_ns
from kvtransit.model.serving.kv_arrival import NO_CLIENT_MESSAGE, KvEndDecision, Verdict
from kvtransit.model.serving.policies import ServingRequest
from kvtransit.runtime.transport import Endpoint
from kvtransit.wire.errors import ErrorCode, RemoteProtocolError
from kvtransit.wire.events import Ack, AckStatus, Bye, Error, Hello, KvBegin, KvChunk, KvEnd, Role, TokenEntry
from kvtransit.wire.limits import WIRE_VERSION, clip_reason

if TYPE_CHECKING:
    from kvtransit.agents.decode.agent import DecodeAgent

log = logging.getLogger(__name__)


class KvIngress:
    def __init__(self, agent: DecodeAgent):
        self.agent = agent
        self.handoffs = {"taken": 0, "duplicate": 0, "aborted": 0}
        # Where hand-off time goes, summed (wall seconds): first token → KvBegin here (sender side and link
        # queue), KvBegin → KvEnd here (the transfer).
        self.phase_s = {"first_token_to_begin": 0.0, "begin_to_end": 0.0, "handoffs": 0}
        self.codecs_seen: set[str] = set()

    async def serve_kv(self, endpoint: Endpoint) -> None:
        """One KV link from a middlebox: say Hello, then reassemble each hand-off and act on its KvEnd."""
        agent = self.agent
        await endpoint.send(Hello(role=Role.DECODE, version=WIRE_VERSION, name=agent.name))
        incoming: dict[int, Incoming] = {}
        reason = "kv link closed mid-stream"
        try:
            while (event := await endpoint.next_event()) is not None:
                if isinstance(event, KvBegin):
                    now = agent.clock.now_ns()
                    arrival = agent.arrivals.begin(event.request_id)
                    # A hand-off a part reads (the real model) is not the synthetic accuracy sample's: its KV is not
                    # the synthetic bank's.
                    real = not arrival.duplicate and any(p.reads_kv(event.request_id) for p in agent.parts)
                    incoming[event.request_id] = Incoming(event, now, sampled=arrival.sampled or real,
                                                           duplicate=arrival.duplicate, real=real)
                    agent.link.begin(now)
                    for part in agent.parts:  # on the link since its first token (the middlebox held it till then)
                        part.kv_begin(event.request_id, now, event.first_token_ns)
                elif isinstance(event, KvChunk):
                    item = incoming[event.request_id]
                    item.wire_bytes += len(event.payload)
                    item.arrived.append(Arrived(agent.clock.now_ns(), len(event.payload), event.raw_bytes,
                                                 event.release_ns))
                    if item.sampled:
                        item.chunks.append((event.layer, event.codec_id, bytes(event.codec_header),
                                            bytes(event.payload), event.shape))
                elif isinstance(event, KvEnd):
                    self._left_link(event.request_id)
                    await self._kv_end(endpoint, incoming.pop(event.request_id))
                elif isinstance(event, Error) and event.request_id in incoming:
                    # The sender gave up on this stream (the wire has closed it): drop what arrived.
                    self._left_link(event.request_id)
                    self._abort(incoming.pop(event.request_id), f"sender gave up: {event.message}")
                elif isinstance(event, Bye):
                    break
        except RemoteProtocolError as exc:
            reason = f"kv stream broken ({exc.code.name.lower().replace('_', ' ')})"
            raise
        finally:
            # Whatever was mid-stream when the connection broke or closed is dropped, never used. The request
            # is not failed here: its sender holds the KV until acked and sends it again (or gives up and
            # says so to the client), so the outcome is the sender's to decide.
            for request_id in list(incoming):
                self._left_link(request_id)
                self._abort(incoming.pop(request_id), reason)

    def _left_link(self, request_id: int) -> None:
        now = self.agent.clock.now_ns()
        for part in self.agent.parts:
            part.kv_left_link(request_id, now)

    async def _kv_end(self, endpoint: Endpoint, item: Incoming) -> None:
        """The whole KV is here: act on what `KvArrivals.end` decides (model/serving/kv_arrival.py says why each)."""
        agent, begin = self.agent, item.begin
        if (withdrawn := agent.withdrawn.get(begin.request_id)) is not None:
            # Its client went away before it came: never decoded (kept in mind, so a resend is dropped too). The
            # FAILED Ack ends it for the middlebox and the prefill (which released it already: it ignores it).
            self._abort(item, withdrawn)
            await endpoint.send(Ack(request_id=begin.request_id, status=AckStatus.FAILED, t_ns=agent.clock.now_ns(),
                                    detail=clip_reason(withdrawn)))
            return
        request = ServingRequest(begin.request_id, begin.prompt_tokens, begin.output_tokens)
        decision = agent.arrivals.end(request, agent.batcher, began_duplicate=item.duplicate,
                                      stopping=agent.is_stopping, has_clients=agent.has_clients)
        if decision.verdict is Verdict.DUPLICATE:
            await self._duplicate(endpoint, item, decision)
        elif decision.verdict in (Verdict.STOPPING, Verdict.NO_CLIENT):
            self._abort(item, decision.reason)
            if decision.verdict is Verdict.NO_CLIENT:  # the Error naming the request tells the sender to retry
                await endpoint.send(Error(code=ErrorCode.OVERLOADED, request_id=begin.request_id,
                                          message=NO_CLIENT_MESSAGE))
        else:
            await self._kv_ready(endpoint, item, request, decision)

    def _abort(self, item: Incoming, reason: str) -> None:
        self.agent.link.abandon(self.agent.clock.now_ns())
        self.handoffs["aborted"] += 1
        self.agent.metrics.kv_handoffs.labels(outcome="aborted").inc()
        log.info("dropped the partial KV of request %d: %s", item.begin.request_id, reason)

    async def _duplicate(self, endpoint: Endpoint, item: Incoming, decision: KvEndDecision) -> None:
        """A hand-off we already took, sent again (our Ack was lost with a link or middlebox): drop it and
        answer as we did the first time, so the sender can release it. Idempotent by request id."""
        now = self.agent.clock.now_ns()
        self.agent.link.abandon(now)
        self.handoffs["duplicate"] += 1
        self.agent.metrics.kv_handoffs.labels(outcome="duplicate").inc()
        await endpoint.send(Ack(request_id=item.begin.request_id, status=_ack_status(decision), t_ns=now,
                                detail=decision.reason))

    async def _kv_ready(self, endpoint: Endpoint, item: Incoming, request: ServingRequest,
                        decision: KvEndDecision) -> None:
        """Taken (accepted or refused): count the transfer, then answer."""
        agent, metrics = self.agent, self.agent.metrics
        ready_ns = agent.clock.now_ns()
        begin = item.begin
        self.handoffs["taken"] += 1
        metrics.kv_handoffs.labels(outcome="taken").inc()
        if item.streamed:
            agent.link.idle(streamed_idle_ns(item.began_ns, item.arrived, agent.latency_ns))
        agent.link.end(ready_ns, item.wire_bytes, begin.raw_bytes)
        if begin.first_token_ns:
            self.phase_s["first_token_to_begin"] += (item.began_ns - begin.first_token_ns) / 1e9
            self.phase_s["begin_to_end"] += (ready_ns - item.began_ns) / 1e9
            self.phase_s["handoffs"] += 1
        agent.splits.record(item, ready_ns)
        self.codecs_seen.add(begin.codec)
        metrics.kv_received_bytes.labels(stage="wire").inc(item.wire_bytes)
        metrics.kv_received_bytes.labels(stage="raw").inc(begin.raw_bytes)
        if decision.verdict is Verdict.REFUSE:
            await endpoint.send(Ack(request_id=begin.request_id, status=AckStatus.FAILED, t_ns=ready_ns,
                                    detail=clip_reason(decision.reason)))
            await agent.fail(begin.request_id, decision.client_reason)
            return
        # The client hears that we hold the KV before the sender may release it (the Ack): if we die between
        # the two, the client knows whom to blame, and the sender still holds the KV.
        await agent.tokens([TokenEntry(request_id=begin.request_id, token_index=0, t_ns=ready_ns)])
        await endpoint.send(Ack(request_id=begin.request_id, status=AckStatus.OK, t_ns=ready_ns))
        agent.enqueue(request, ready_ns)
        if item.real:
            for part in agent.parts:
                if part.reads_kv(begin.request_id):
                    part.kv_ready(item)
        elif item.sampled:  # queued, not awaited: the connection's next hand-off must not wait for it
            agent.sample.submit(item)

    def stats(self) -> dict:
        return {"kv_handoffs": dict(self.handoffs), "handoff_phases_s": dict(self.phase_s)}


def _ack_status(decision: KvEndDecision) -> AckStatus:
    return AckStatus.OK if decision.ack_ok else AckStatus.FAILED
