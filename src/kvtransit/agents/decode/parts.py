"""What decode asks of its parts (agents/skeleton.py: `Part`), every hook's default doing nothing.

A part of decode is a flow's (selection's remote-KV legs: flows/selection/components.py; a TP group's leader:
flows/tp/components.py) or the core's own (the real model reading what arrived: agents/decode/model_accuracy.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvtransit.agents.decode.incoming import Incoming
from kvtransit.agents.stepping import StepHolder
from kvtransit.runtime.clock import DeadlineSchedule


class DecodePart(StepHolder):
    def extra_context(self, running_ids: Sequence[int]) -> int:
        """Tokens the next step's attention reads beyond the batch's own KV (a remote context's)."""
        return 0

    async def before_step(self, step: int, running_ids: Sequence[int], schedule: DeadlineSchedule) -> None:
        """Before a step's compute (its due start is `schedule.deadline_ns`): fetch what it reads; a late fetch
        pushes the schedule on (`schedule.add`). Raises StepFailed naming the requests it fails."""

    def kv_begin(self, request_id: int, now_ns: int, first_token_ns: int) -> None:
        """A hand-off's KvBegin arrived (its KV has been on the link since its first token)."""

    def kv_left_link(self, request_id: int, now_ns: int) -> None:
        """A hand-off left the link (its KvEnd, or its stream ended)."""

    def reads_kv(self, request_id: int) -> bool:
        """Does this part read the request's KV as it arrived (its chunks kept)?"""
        return False

    def kv_ready(self, item: Incoming) -> None:
        """A hand-off this part reads is whole and taken (never on the step loop's time: spawn the work)."""

    def kv_content_mismatches(self) -> int:
        """Hand-offs whose raw KV differed from what the prefill sent, as this part found."""
        return 0
