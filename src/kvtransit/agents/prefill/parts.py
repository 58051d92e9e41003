"""What the prefill asks of its parts (agents/skeleton.py: `Part`), every hook's default doing nothing.

A part of the prefill is a flow's (the tier's prefix cache: flows/tier/components.py; a TP group's leader:
flows/tp/components.py; a ring's leader: flows/ring/components.py) or the core's own (the real model's KV:
agents/prefill/real_kv.py). The prefill asks every part each question in order; the first that answers decides.
"""

from __future__ import annotations

from collections.abc import Callable

from kvtransit.agents.prefill.handoff_frames import KvSource
from kvtransit.agents.stepping import StepHolder
from kvtransit.model.kv_scale import KvLayout
from kvtransit.wire.events import Request

# Queue a request whose lookup is done: the request, and the tokens of its prompt found cached.
Enqueue = Callable[[Request, int], None]


class PrefillPart(StepHolder):
    def admit(self, request: Request, enqueue: Enqueue) -> bool:
        """A new request: True if this part queues it itself (through `enqueue`, once it has looked up its cached
        prefix); False leaves it to the prefill, which queues it at once with nothing cached."""
        return False

    def cached_tokens(self, request_id: int) -> int:
        """Tokens of the request's prompt found cached (0: none, or not this part's to say)."""
        return 0

    def step_ran(self, request_id: int) -> None:
        """The request's (last) step has run: what it computed is this part's now (a write-back)."""

    def forget(self, request_id: int) -> None:
        """The request left before its step ran (its client withdrew it, or its step failed)."""

    def kv_source(self, request: Request) -> tuple[KvSource, KvLayout, int] | None:
        """Where the request's KV comes from, its layout and tokens, if not the synthetic bank over its prompt."""
        return None
