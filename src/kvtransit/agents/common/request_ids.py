"""Request ids as the agents hold them: the wire's integers.

The model's serving policies (`PrefillQueue`, `plan_prefill_step`, `DecodeBatcher`) are shared with the
simulator and carry a request's id as any `Hashable`; an agent only ever gives them the wire's `request_id`, an
int, and takes it back with `wire_id` to index its own tables and to put it on the wire again.
"""

from __future__ import annotations

from collections.abc import Hashable


def wire_id(request_id: Hashable) -> int:
    """`request_id` as handed back by a model policy: the int the agent gave it."""
    if not isinstance(request_id, int):
        raise TypeError(f"a request id from the wire is an int, got {request_id!r}")
    return request_id
