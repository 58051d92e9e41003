"""A TP group's leader (flows/tp/group/leader.py, in this process as a prefill or decode runs it) and its follower
rank processes (`python -m kvtransit.flows.tp.group`): every step's order reaches every rank, every rank's sum of
every step is exact, whatever the step's size (a batch changes it), ring or switch, and with EP every all-to-all
chunk arrives as its sender made it; a follower that dies fails the group with a reason naming it, within the
collective's deadline, never a hang."""

from __future__ import annotations

import asyncio
import time

import pytest

from kvtransit.flows.tp.group.leader import GroupFailed, GroupLeader, LeaderConfig
from kvtransit.flows.tp.group.orders import FollowerConfig
from kvtransit.flows.tp.switch.server import SwitchServer
from kvtransit.harness.children import Child, collect_results, reap, spawn
from kvtransit.model.module.budget import Module
from kvtransit.runtime.clock import MonotonicClock

# A scale-up link slow enough that a loopback hop in Python keeps up with it: 200 MB/s, 200 µs.
RATE_BPS, LATENCY_S = 200e6, 200e-6
DEADLINE_S = 3.0
STEP_S = 0.01  # the compute held before each all-reduce


async def _start_group(mode: str, n: int) -> tuple[GroupLeader, list[Child], SwitchServer | None]:
    followers = [await spawn(f"rank {r}", "kvtransit.flows.tp.group",
                             FollowerConfig(group=1, rank=r, size=n, mode=mode, rate_Bps=RATE_BPS,
                                            latency_s=LATENCY_S, deadline_s=DEADLINE_S).__dict__)
                 for r in range(1, n)]
    ready = [await f.wait_ready(one_line=True) for f in followers]
    switch = None
    where = None
    if mode == "switch":
        switch = SwitchServer(MonotonicClock(), group=1, size=n, rate_Bps=RATE_BPS, latency_s=LATENCY_S,
                              module=Module(), deadline_s=DEADLINE_S, collectives=1)
        where = ["127.0.0.1", await switch.start("127.0.0.1", 0)]
    config = LeaderConfig(group=1, size=n, mode=mode, switch=where, deadline_s=DEADLINE_S,
                          followers=[{"control": ["127.0.0.1", r["control_port"]],
                                      "ring": ["127.0.0.1", r["ring_port"]]} for r in ready])
    leader = GroupLeader(config, MonotonicClock(), rate_Bps=RATE_BPS, latency_s=LATENCY_S)
    await leader.start()
    return leader, followers, switch


async def _step(leader: GroupLeader, step: int, values: int, alltoall_values: int = 0) -> None:
    at_ns = time.monotonic_ns() + round(STEP_S * 1e9)
    await leader.order(step, values, at_ns, alltoall_values)
    await leader.clock.sleep_until(at_ns)
    await leader.allreduce(step, values, at_ns, alltoall_values)


async def _steps(leader: GroupLeader, steps: range, values: int) -> None:
    for step in steps:
        await _step(leader, step, values)


@pytest.mark.parametrize("mode", ["ring", "switch"])
@pytest.mark.parametrize("n", [2, 4])
async def test_every_rank_gets_the_exact_sum_of_every_step_whatever_its_size(mode, n):
    leader, followers, switch = await _start_group(mode, n)
    sizes = [n * 16, n * 4096, n, n * 1000, n * 16]  # a batch that grows and shrinks
    try:
        for step, values in enumerate(sizes):
            await _step(leader, step, values)
        await leader.close()
        results = await collect_results(followers, 10.0)
    finally:
        await reap(followers)
        if switch is not None:
            await switch.close()
    assert leader.failure is None and leader.sums_checked == len(sizes)
    assert leader.followers_done == (n - 1) * len(sizes)  # every follower said its sum was exact, every step
    for result in results:
        assert result is not None and result["ok"], result
        assert result["steps"] == result["sums_checked"] == len(sizes)
    if switch is not None:
        assert switch.stats()["sums"] == len(sizes)


@pytest.mark.parametrize("mode", ["ring", "switch"])
async def test_a_follower_that_dies_fails_the_group_with_a_reason_naming_it(mode):
    leader, followers, switch = await _start_group(mode, 4)
    try:
        await _step(leader, 0, 4 * 64)
        followers[1].kill()  # rank 2
        await followers[1].started.wait()
        started = time.monotonic()
        with pytest.raises(GroupFailed) as err:
            await _steps(leader, range(1, 4), 4 * 64)
        assert time.monotonic() - started < DEADLINE_S * 3  # failed, never hung
        assert "rank 2" in str(err.value), err.value
        # Once failed, the group refuses every later step with the same reason.
        with pytest.raises(GroupFailed, match=r"^TP group failed: "):
            await _step(leader, 9, 4 * 64)
    finally:
        await leader.close()
        await reap(followers)
        if switch is not None:
            await switch.close()


async def test_a_follower_refuses_an_order_that_is_not_a_whole_ring():
    leader, followers, _ = await _start_group("ring", 2)
    try:
        with pytest.raises(GroupFailed, match="not a multiple of the group's 2"):
            await _step(leader, 0, 3)
    finally:
        await leader.close()
        await reap(followers)


async def test_a_serving_group_may_idle_past_the_collective_deadline_between_steps():
    """A decode idles between requests: the switch (idle_s) and the followers wait for the next step as long as it
    takes; inside a collective the deadline still holds."""
    leader, followers, switch = await _start_group("switch", 2)
    assert switch is not None
    try:
        switch.deadline_s, switch.idle_s = 0.3, 3600.0
        await _step(leader, 0, 2 * 64)
        await asyncio.sleep(1.0)  # idle, over three collective deadlines
        await _step(leader, 1, 2 * 64)
        assert leader.failure is None and leader.sums_checked == 2 and not switch.failure
    finally:
        await leader.close()
        await reap(followers)
        await switch.close()


@pytest.mark.parametrize("n", [2, 4])
async def test_an_ep_group_runs_each_steps_alltoall_with_every_chunk_checked(n):
    leader, followers, _ = await _start_group("ring", n)
    sizes = [(n * 64, 128), (n * 512, 1024), (n * 64, 7)]  # (all-reduce values, all-to-all values a hop)
    try:
        for step, (values, alltoall) in enumerate(sizes):
            await _step(leader, step, values, alltoall)
        await leader.close()
        results = await collect_results(followers, 10.0)
    finally:
        await reap(followers)
    assert leader.failure is None and leader.sums_checked == leader.alltoalls_checked == len(sizes)
    assert leader.followers_done == (n - 1) * len(sizes)
    assert all(r is not None and r["ok"] and r["steps"] == len(sizes) for r in results), results
