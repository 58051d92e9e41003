"""A follower's side of its group's control connection: each order from the leader in turn, carried out, then
DONE; the leader's BYE or its leaving is the run's end; its ABORT, or a frame that is not an order, fails the
follower with the reason.

A TP group's follower rank (flows/tp/group/follower.py: an order is a step's all-reduce) and a ring's
(flows/ring/follower.py: an order is a ring prompt) both follow their leader this way; what the leader hears
back is runtime/group_link/answers.py.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

from kvtransit.runtime.group_link.answers import IDLE_WAIT_S
from kvtransit.runtime.group_link.channel import Channel, PeerGone
from kvtransit.wire.group import Frame, Kind


def go_frame(group: int, where: dict[str, Any]) -> Frame:
    """GO, the leader's first word to a follower: where its next rank is (`{"next": [host, port]}`, a ring) or the
    switch (`{"switch": [host, port]}`)."""
    return Frame(Kind.GO, group, payload=json.dumps(where).encode())


def read_go(frame: Frame) -> dict[str, Any]:
    return dict(json.loads(bytes(frame.payload).decode()))


async def follow_orders(control: Channel, group: int, rank: int, carry_out: Callable[[Frame], Awaitable[None]], *,
                        order: str, who: str, failed: Callable[[str], Exception]) -> None:
    """Carry out each STEP order on `control` until the leader leaves (its BYE or EOF) or says ABORT.

    `order` names what is awaited ("step", "ring prompt"), `who` this follower in a reason ("rank 2"), `failed`
    makes the exception a failure raises (the follower's own, which its caller turns into an ABORT)."""
    while True:
        try:
            frame = await control.receive(IDLE_WAIT_S, f"the next {order}'s order")
        except PeerGone:
            return  # the leader is gone: it stopped (a failure there is the leader's to report)
        if frame.kind is Kind.BYE:
            return
        if frame.kind is Kind.ABORT:
            raise failed(frame.reason)
        if frame.kind is not Kind.STEP:
            raise failed(f"{who}: expected a {order}'s order from the leader, got {frame.kind.name}")
        await carry_out(frame)
        with contextlib.suppress(PeerGone):
            await control.send(Frame(Kind.DONE, group, frame.step, rank=rank), shaped=False)
