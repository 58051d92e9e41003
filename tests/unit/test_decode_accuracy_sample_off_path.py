"""Decode's accuracy sample is measured beside the run, never on the path it measures: a sampled hand-off's
measurement still running does not hold the connection's next hand-off, and /stats waits for it so the report
counts every sample. ManualClock and in-memory endpoints: no sockets."""

from __future__ import annotations

import asyncio
import threading

from kvtransit.agents.decode.agent import DecodeAgent
from kvtransit.agents.decode.incoming import Incoming
from kvtransit.agents.process import Address
from kvtransit.agents.skeleton import merged_stats
from kvtransit.model.scenario import Scenario
from kvtransit.runtime.clock import ManualClock
from kvtransit.wire.events import AckStatus, Role

from ._manual_time import cancel, greeted_pair
from .test_decode_cancel import T0, hand_off

ANY = Address("127.0.0.1", 0)


async def test_a_sampled_handoff_being_measured_does_not_hold_the_next_handoff_and_stats_wait_for_it():
    agent = DecodeAgent(Scenario(codec="none", dilation=3.0), name="decode-test", listen=ANY, client_listen=ANY,
                        metrics_listen=ANY, accuracy_sample=1, clock=ManualClock(T0))
    release, started, measured = threading.Event(), threading.Event(), []

    def slow_measure(item: Incoming) -> None:  # a measurement that takes as long as the test says
        started.set()
        assert release.wait(10.0)
        measured.append(item.begin.request_id)
        agent.sample.codec.requests += 1

    agent.sample.measure = slow_measure  # type: ignore[method-assign]
    _client, serving_client = await greeted_pair(Role.LOADGEN, Role.DECODE, agent.serve_client)
    link, serving_kv = await greeted_pair(Role.MIDDLEBOX, Role.DECODE, agent.ingress.serve_kv)
    try:
        assert (await hand_off(link, 1)).status == AckStatus.OK  # the first hand-off taken is the sample
        assert await asyncio.to_thread(started.wait, 5.0)
        second = await asyncio.wait_for(hand_off(link, 2), 5.0)  # taken while request 1 is still being measured
        assert second.status == AckStatus.OK and measured == []
        stats = asyncio.ensure_future(merged_stats(agent))
        await asyncio.sleep(0.05)
        assert not stats.done()  # /stats waits for the queued measurement
        release.set()
        accuracy = (await asyncio.wait_for(stats, 5.0))["accuracy"]
        assert measured == [1] and accuracy["sampled_requests"] == accuracy["queued_requests"] == 1
    finally:
        release.set()
        await agent.sample.close()
        await cancel(serving_client, serving_kv)
