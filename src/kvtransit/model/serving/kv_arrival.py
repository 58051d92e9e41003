"""What a decode instance does with a KV hand-off as it arrives (docs/reference.md §4; the I/O is
agents/decode/agent.py).

A hand-off is a KvBegin, its chunks and a KvEnd. At its KvBegin decode decides whether the stream is a retry
of one it already took (then its bytes are drained, never used) and whether it is in the accuracy sample. At
its KvEnd, the whole KV is here and checked by the wire, and decode decides, in this order:

1. **duplicate**: taken before (the sender never saw our Ack: it died with a link or the middlebox): drop it
   and answer what the first arrival got, so the sender can release it. Hand-offs are idempotent by id.
2. **stopping**: decode is going away: no Ack (the sender would release KV no one will decode); it is sent
   again to whoever serves next.
3. **no client**: no load generator is connected to hear its tokens (a restarted decode, before the load
   generator dialled back): an Error naming the request makes the sender retry.
4. **refuse**: prompt + output can never fit decode's KV capacity: a FAILED Ack (final) and the request fails.
5. **accept**: otherwise. Refused and accepted hand-offs are both remembered as taken.

Pure: `KvArrivals` holds the memory of taken requests (bounded, oldest forgotten first) and the sample count.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass

from kvtransit.model.serving.policies import DecodeBatcher, ServingRequest

KNOWN_REQUESTS = 65_536
"""Request ids remembered as taken, so a retried hand-off is dropped and re-acked instead of decoded twice. The
oldest are forgotten first; 65,536 is far more hand-offs than can be in retry at once (a retry comes within the
prefill's hand-off deadline, HANDOFF_DEADLINE_S = 30 s, at a few hundred hand-offs a second at most)."""

NOT_TAKEN_STOPPING = "decode is stopping"
NOT_TAKEN_NO_CLIENT = "no load generator connected"
NO_CLIENT_MESSAGE = "decode has no client to stream tokens to yet"
"""The Error's message to the sender (the Error's code says OVERLOADED: retry)."""
DUPLICATE_DETAIL = "duplicate"
"""The Ack.detail of a re-ack: the sender's logs tell a retry's answer from the first."""


class Verdict(enum.Enum):
    ACCEPT = "accept"
    DUPLICATE = "duplicate"
    STOPPING = "stopping"
    NO_CLIENT = "no-client"
    REFUSE = "refuse"


@dataclass(frozen=True)
class KvBeginDecision:
    duplicate: bool  # a retry of a request already taken: drain its bytes, never use them
    sampled: bool  # keep its chunks to measure the codec's error against the reference KV


@dataclass(frozen=True)
class KvEndDecision:
    verdict: Verdict
    ack_ok: bool = True  # the Ack status to answer (ACCEPT, REFUSE, DUPLICATE): OK, or FAILED
    reason: str = ""  # why it was not taken (the log, the FAILED Ack's detail, the failed request's reason)
    client_reason: str = ""  # REFUSE: the failure reason the load generator is told (a fixed, countable phrase)


def refusal_reason(request: ServingRequest, capacity_tokens: int) -> str:
    return f"needs {request.kv_reservation_tokens} KV tokens, more than decode holds ({capacity_tokens})"


class KvArrivals:
    """Which hand-offs this decode instance took (and the Ack each got), and how many are in the accuracy sample."""

    def __init__(self, accuracy_sample: int, known: int = KNOWN_REQUESTS) -> None:
        if accuracy_sample < 0:
            raise ValueError(f"accuracy_sample must be >= 0, got {accuracy_sample}")
        if known < 1:
            raise ValueError(f"known must be >= 1, got {known}")
        self.accuracy_sample = accuracy_sample
        self.known = known
        self.sampled = 0
        self._taken: OrderedDict[Hashable, bool] = OrderedDict()  # request id → whether its Ack was OK

    def __contains__(self, request_id: Hashable) -> bool:
        return request_id in self._taken

    def __len__(self) -> int:
        return len(self._taken)

    def begin(self, request_id: Hashable) -> KvBeginDecision:
        """A KvBegin arrived: is it a retry, and does it join the accuracy sample (the first N taken)?"""
        duplicate = request_id in self._taken
        sampled = not duplicate and self.sampled < self.accuracy_sample
        if sampled:
            self.sampled += 1
        return KvBeginDecision(duplicate=duplicate, sampled=sampled)

    def end(self, request: ServingRequest, batcher: DecodeBatcher, *, began_duplicate: bool, stopping: bool,
            has_clients: bool) -> KvEndDecision:
        """Its KvEnd arrived (the KV is whole and checked): what to do with it (the module docstring's order).

        `began_duplicate`: what `begin` said; a request taken since (by another stream) is a duplicate too.
        Accepted and refused requests are remembered as taken here."""
        request_id = request.request_id
        if began_duplicate or request_id in self._taken:
            return KvEndDecision(Verdict.DUPLICATE, ack_ok=self._taken.get(request_id, True), reason=DUPLICATE_DETAIL)
        if stopping:
            return KvEndDecision(Verdict.STOPPING, reason=NOT_TAKEN_STOPPING)
        if not has_clients:
            return KvEndDecision(Verdict.NO_CLIENT, reason=NOT_TAKEN_NO_CLIENT)
        if not batcher.fits_ever(request):
            self._remember(request_id, ok=False)
            return KvEndDecision(Verdict.REFUSE, ack_ok=False,
                                 reason=refusal_reason(request, batcher.kv_capacity_tokens),
                                 client_reason="kv does not fit decode")
        self._remember(request_id, ok=True)
        return KvEndDecision(Verdict.ACCEPT)

    def _remember(self, request_id: Hashable, *, ok: bool) -> None:
        self._taken[request_id] = ok
        while len(self._taken) > self.known:
            self._taken.popitem(last=False)
