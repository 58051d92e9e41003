"""The egress shaper's scheduling, on a ManualClock: exact times, FIFO order, channels, live retuning."""

from __future__ import annotations

import asyncio

import pytest

from kvtransit.runtime.clock import ManualClock
from kvtransit.runtime.egress import EgressShaper
from kvtransit.runtime.transport import memory_pair
from kvtransit.shaping.errors import ShapingError
from kvtransit.wire import Role
from kvtransit.wire.events import DType, Hello, KvBegin, KvChunk
from kvtransit.wire.limits import WIRE_VERSION

RATE = 1_000_000.0  # 1 MB/s: 1 µs per byte, so expected times are easy to read
LATENCY = 0.010
PAYLOAD = 20_000
# The readers `link` starts, held here: the loop keeps only a weak reference to a task.
_READERS: list[asyncio.Task] = []


async def link(clock):
    """A middlebox→decode memory pair with hellos exchanged; returns (sender, arrival times by event type)."""
    sender, receiver = memory_pair(Role.MIDDLEBOX, Role.DECODE)
    await sender.send(Hello(role=Role.MIDDLEBOX, version=WIRE_VERSION, name="mb"))
    await receiver.send(Hello(role=Role.DECODE, version=WIRE_VERSION, name="dec"))
    arrivals: list[tuple[str, int]] = []

    async def read():
        async for event in receiver:
            if not isinstance(event, Hello):
                arrivals.append((type(event).__name__, clock.now_ns()))

    _READERS.append(asyncio.create_task(read()))
    await sender.next_event()  # the decode side's hello
    return sender, arrivals


async def handoff(shaper, endpoint, request_id, label):
    async with shaper.transfer(endpoint, label) as tx:
        await tx.send(KvBegin(request_id=request_id, prompt_tokens=1, output_tokens=1, n_layers=1, n_chunks=1,
                              raw_bytes=PAYLOAD, codec="none", first_token_ns=0))
        await tx.send(KvChunk(request_id=request_id, layer=0, chunk=0, dtype=DType.U8, shape=(PAYLOAD,), codec_id=0,
                              codec_header=b"", payload=bytes(PAYLOAD), raw_bytes=PAYLOAD))
        await tx.send(endpoint.connection.kv_end(request_id))
    return tx.record


def modelled_ns(record) -> int:
    return round((record.wire_bytes / RATE + LATENCY) * 1e9)


async def test_a_transfer_takes_bytes_over_rate_plus_latency_exactly():
    clock = ManualClock()
    shaper = EgressShaper(rate_Bps=RATE, latency_s=LATENCY, clock=clock, slice_bytes=4096)
    endpoint, arrivals = await link(clock)
    task = asyncio.create_task(handoff(shaper, endpoint, 1, "a"))
    await clock.advance(1.0)
    record = await task
    assert record.wire_bytes > PAYLOAD  # headers count: they cross the link too
    assert record.ended_ns - record.started_ns == pytest.approx(modelled_ns(record), abs=1000)
    assert arrivals[-1] == ("KvEnd", record.ended_ns)
    assert shaper.transfers_done == 1
    assert shaper.achieved_rate_Bps == pytest.approx(RATE, rel=1e-4)


async def test_bytes_are_released_in_slices_not_all_at_the_end():
    clock = ManualClock()
    shaper = EgressShaper(rate_Bps=RATE, latency_s=LATENCY, clock=clock, slice_bytes=4096)
    endpoint, arrivals = await link(clock)
    task = asyncio.create_task(handoff(shaper, endpoint, 1, "a"))
    await clock.advance(LATENCY - 1e-6)
    assert endpoint.transport.get_write_buffer_size() == 0 and not arrivals  # nothing before one latency
    await clock.advance(0.011)  # latency + 11 ms at 1 µs/byte: about half the chunk is out, no more
    assert [name for name, _ in arrivals] == ["KvBegin"]
    await clock.advance(1.0)
    await task
    assert [name for name, _ in arrivals] == ["KvBegin", "KvChunk", "KvEnd"]


async def test_one_channel_serves_handoffs_first_come_first_served():
    clock = ManualClock()
    shaper = EgressShaper(rate_Bps=RATE, latency_s=LATENCY, clock=clock)
    tasks = []
    for i, label in enumerate("abc"):
        endpoint, _ = await link(clock)
        tasks.append(asyncio.create_task(handoff(shaper, endpoint, i + 1, label)))
        await asyncio.sleep(0)  # queue them in this order
    await clock.advance(1.0)
    a, b, c = [await t for t in tasks]
    assert a.started_ns == 0
    assert b.started_ns == a.ended_ns and c.started_ns == b.ended_ns
    assert (a.queued_ns, b.queued_ns, c.queued_ns) == (0, 0, 0)
    assert c.queue_s == pytest.approx((a.ended_ns + b.ended_ns - 2 * a.started_ns) / 1e9 - a.transfer_s)
    assert shaper.busy_ratio(now_ns=c.ended_ns) == pytest.approx(1.0, rel=1e-3)  # never idle in between


async def test_two_channels_carry_two_handoffs_at_once_and_queue_the_third():
    clock = ManualClock()
    shaper = EgressShaper(rate_Bps=RATE, latency_s=LATENCY, clock=clock, channels=2)
    tasks = []
    for i, label in enumerate("abc"):
        endpoint, _ = await link(clock)
        tasks.append(asyncio.create_task(handoff(shaper, endpoint, i + 1, label)))
        await asyncio.sleep(0)
    await clock.advance(1.0)
    a, b, c = [await t for t in tasks]
    assert a.started_ns == b.started_ns == 0
    assert {a.channel, b.channel} == {0, 1}
    assert a.transfer_s == pytest.approx(b.transfer_s)  # each channel runs at the full link rate
    assert c.started_ns == min(a.ended_ns, b.ended_ns)


async def test_rate_and_latency_change_live():
    clock = ManualClock()
    shaper = EgressShaper(rate_Bps=RATE, latency_s=LATENCY, clock=clock, slice_bytes=1000)
    endpoint, _ = await link(clock)
    task = asyncio.create_task(handoff(shaper, endpoint, 1, "a"))
    await clock.advance(0.005)
    shaper.set_rate(4 * RATE)
    await clock.advance(1.0)
    first = await task
    serialising_s = first.transfer_s - LATENCY
    assert serialising_s < 0.5 * first.wire_bytes / RATE  # all but the first 5 ms went 4x as fast

    shaper.set_latency(0.0)
    endpoint2, _ = await link(clock)
    task = asyncio.create_task(handoff(shaper, endpoint2, 2, "b"))
    await clock.advance(1.0)
    second = await task
    assert second.latency_s == 0.0 and second.rate_Bps == 4 * RATE
    assert second.transfer_s == pytest.approx(second.wire_bytes / (4 * RATE), rel=1e-3)
    with pytest.raises(ShapingError):
        shaper.set_rate(0)


def test_a_shaper_needs_at_least_one_channel():
    with pytest.raises(ValueError, match="channels"):
        EgressShaper(rate_Bps=RATE, channels=0, clock=ManualClock())


async def test_a_burst_hands_the_first_slice_over_at_the_start_and_paces_the_rest():
    """With tc shaping the link, our bucket only runs ahead of tc's (burst_bytes = a slice): the first slice must
    reach the qdisc when the transfer starts, not a slice's serialisation later."""
    slice_bytes = 4096
    clock = ManualClock()
    shaper = EgressShaper(rate_Bps=RATE, clock=clock, slice_bytes=slice_bytes, burst_bytes=slice_bytes)
    endpoint, _ = await link(clock)
    task = asyncio.create_task(handoff(shaper, endpoint, 1, "a"))
    await clock.advance(1.0)
    record = await task
    # The burst's bytes take no time (without it the transfer takes wire_bytes / rate, the test above); the
    # rest still take theirs at the rate.
    assert record.ended_ns - record.started_ns == pytest.approx((record.wire_bytes - slice_bytes) / RATE * 1e9,
                                                                abs=1000)


async def test_a_burst_does_not_shorten_a_modules_hold():
    """A transit-bound module holds each frame for its compute time (min_serialise_s); the burst that lets a
    tc-shaped link's first slice through at once must not take that time off the module."""
    slice_bytes = 4096
    hold_s = 0.5  # far above PAYLOAD / RATE (20 ms): the module binds
    clock = ManualClock()
    shaper = EgressShaper(rate_Bps=RATE, clock=clock, slice_bytes=slice_bytes, burst_bytes=slice_bytes)
    endpoint, _ = await link(clock)

    async def held_handoff():
        async with shaper.transfer(endpoint, "held") as tx:
            await tx.send(KvBegin(request_id=1, prompt_tokens=1, output_tokens=1, n_layers=1, n_chunks=1,
                                  raw_bytes=PAYLOAD, codec="none", first_token_ns=0))
            started_ns = clock.now_ns()
            await tx.send(KvChunk(request_id=1, layer=0, chunk=0, dtype=DType.U8, shape=(PAYLOAD,), codec_id=0,
                                  codec_header=b"", payload=bytes(PAYLOAD), raw_bytes=PAYLOAD),
                          min_serialise_s=hold_s)
        return tx.record, started_ns

    task = asyncio.create_task(held_handoff())
    await clock.advance(2.0)
    record, chunk_ready_ns = await task
    # The chunk's bytes finish no sooner than its hold after it was ready (KvBegin took the burst before it).
    assert record.ended_ns - chunk_ready_ns >= hold_s * 1e9 - 1000


async def test_a_handoff_held_for_its_first_token_is_on_the_link_only_from_then():
    """A hand-off may get its channel before its first token (the prefill sends its KV during its step, the
    middlebox holds it until the step's end): that hold is neither a wait for the link nor time on it, so the
    achieved rate and the link's busy time count from the first frame's ready time."""
    clock = ManualClock()
    shaper = EgressShaper(rate_Bps=RATE, latency_s=LATENCY, clock=clock, slice_bytes=4096)
    endpoint, _ = await link(clock)
    first_token_ns = 30_000_000  # 30 ms after the channel was free and taken

    async def held_handoff():
        async with shaper.transfer(endpoint, "held") as tx:
            await tx.send(KvBegin(request_id=1, prompt_tokens=1, output_tokens=1, n_layers=1, n_chunks=1,
                                  raw_bytes=PAYLOAD, codec="none", first_token_ns=first_token_ns),
                          ready_ns=first_token_ns)
            await tx.send(KvChunk(request_id=1, layer=0, chunk=0, dtype=DType.U8, shape=(PAYLOAD,), codec_id=0,
                                  codec_header=b"", payload=bytes(PAYLOAD), raw_bytes=PAYLOAD), ready_ns=first_token_ns)
            await tx.send(endpoint.connection.kv_end(1), ready_ns=first_token_ns)
        return tx.record

    task = asyncio.create_task(held_handoff())
    await clock.advance(1.0)
    record = await task
    assert record.started_ns == 0 and record.ready_ns == first_token_ns
    assert record.queue_s == 0.0  # it had its channel before it was ready
    assert record.transfer_s * 1e9 == pytest.approx(modelled_ns(record), abs=1000)  # not + the 30 ms hold
    assert shaper.achieved_rate_Bps == pytest.approx(RATE, rel=1e-4)
    assert shaper.busy_s == pytest.approx(modelled_ns(record) / 1e9, abs=1e-6)


async def test_another_flows_stamped_bytes_queue_on_the_link_with_the_hand_offs():
    """Remote KV's legs (`--kv-placement remote`) are stamped on channel 0's bucket: behind a hand-off's slices when
    one runs, and a hand-off after them waits for their time; the link's rate counts them in the hand-off's time."""
    clock = ManualClock()
    shaper = EgressShaper(rate_Bps=RATE, latency_s=LATENCY, clock=clock, slice_bytes=4096)
    # An idle link: latency + bytes / rate from when the frame was ready.
    assert shaper.stamp(10_000, ready_ns=0) == round((10_000 / RATE + LATENCY) * 1e9)
    assert shaper.busy_s == pytest.approx(10_000 / RATE)
    # A hand-off that starts now queues behind those 10 ms of stamped bytes ...
    endpoint, _ = await link(clock)
    task = asyncio.create_task(handoff(shaper, endpoint, 1, "a"))
    await clock.advance(0.005)
    # ... and bytes stamped while it runs go between its slices, and it ends later by their time.
    due = shaper.stamp(5_000, ready_ns=clock.now_ns())
    await clock.advance(1.0)
    record = await task
    assert record.ended_ns == pytest.approx(round((0.010 + (record.wire_bytes + 5_000) / RATE + LATENCY) * 1e9),
                                            abs=5_000)
    assert due < record.ended_ns  # the stamped frame is out before the hand-off's last slice
    # Both stamped frames took link time inside the hand-off's (it started at 0, behind the first): its time counts
    # them, its rate too, and the link's busy time has them once.
    assert record.shared_bytes == pytest.approx(15_000)
    assert shaper.achieved_rate_Bps == pytest.approx(RATE, rel=0.02)
    assert shaper.busy_s == pytest.approx(record.transfer_s, rel=1e-6)
    assert shaper.stamped_bytes == 15_000
