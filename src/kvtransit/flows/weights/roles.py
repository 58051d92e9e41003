"""The two roles of a live weight flow, each one process (`python -m kvtransit.flows.weights`):

    instance ──LOAD weights──▶ store        instance ◀══ the weights' bytes over the link ══ store   (cold start)
    instance ──LOAD adapter i──▶ store      instance ◀══ adapter i's bytes over the link ═══ store   (a miss)

The instance is unavailable until its weights have arrived (a cold start, measured). Then it serves its requests
one at a time, first come first served, each naming an adapter: a resident one (its LRU of `capacity` slots,
flows/weights/model.py: AdapterLru) costs nothing; another is paged in over the link first. The prefill is held on the
clock (the model's), and its end is the request's first token: TTFT = its wait in line + the adapter's load + the
prefill, measured on this host's clock from the request's arrival.

Model time runs on absolute deadlines, as the other live groups' (flows/tp/rank/rank.py): the store stamps each
answer with when it is due on the modelled link, counted from when its request was due (`at_ns`), and the instance
holds it until then; the store's and the instance's host work (making, compressing, checking the bytes) overlaps
the modelled transfer. Every byte is checked against what was sent (content.py): a lossless flow that changed one
fails the run. Failures end the run with one reason naming the role and the request, passed on, never hung.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from kvtransit.flows.weights import content
from kvtransit.flows.weights.content import BlobError, LosslessKernel
from kvtransit.flows.weights.model import AdapterLru
from kvtransit.runtime.clock import Clock
from kvtransit.runtime.group_link.channel import Channel
from kvtransit.wire.group import Frame, Kind, abort

GROUP = 1
ROLE_STORE, ROLE_INSTANCE = 0, 1
ROLE_NAMES = {ROLE_STORE: "store", ROLE_INSTANCE: "instance"}
WEIGHTS_REQUEST = 0  # the LOAD/BLOB `step` of the cold start; request i's adapter is step i + 1


@dataclass(frozen=True)
class WeightsPlan:
    """What both roles of one run agree on; bytes at the run's scale, durations stretched by its dilation."""

    weights_bytes: int
    adapter_bytes: int
    kernel: str  # none | zstd (content.py)
    capacity: int  # adapter slots on the instance
    arrivals_s: tuple[float, ...]  # each request's arrival after the instance is ready
    adapters: tuple[int, ...]  # each request's adapter
    prefill_s: float
    deadline_s: float = 10.0

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


class WeightsFailed(Exception):
    """The run failed; the message is the one reason both roles report."""


@dataclass
class StoreResult:
    ok: bool = True
    reason: str = ""
    loads: int = 0
    raw_bytes: int = 0
    wire_bytes: int = 0

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


WEIGHTS_KEY = "weights"


def weights_at_rest(plan: WeightsPlan) -> dict[str, tuple[int, bytes]]:
    """The store's weights as it holds them (raw size, encoded), made before the clock starts: a store holds its
    blobs at rest, and making hundreds of MB inside the cold start would be the host's time, not the link's."""
    raw = content.weights(plan.weights_bytes)
    return {WEIGHTS_KEY: (len(raw), LosslessKernel(plan.kernel).encode(raw))}


async def serve_store(plan: WeightsPlan, instance: Channel, at_rest: dict[str, tuple[int, bytes]]) -> StoreResult:
    """Answer the instance's loads until it says BYE. The weights come at rest (`weights_at_rest`); an adapter is
    made and encoded at its first load and kept."""
    result, kernel = StoreResult(), LosslessKernel(plan.kernel)
    try:
        while True:
            frame = await instance.receive_or_fail(plan.deadline_s * (len(plan.adapters) + 2),
                                                   "the instance's next load", WeightsFailed, "the store")
            if frame.kind is Kind.BYE:
                return result
            if frame.kind is not Kind.LOAD:
                raise WeightsFailed(f"the store: unexpected {frame.kind.name} for request {frame.step}")
            what = json.loads(bytes(frame.payload))
            key = WEIGHTS_KEY if what.get("weights") else f"adapter {int(what['adapter'])}"
            if key not in at_rest:
                raw = content.adapter(int(what["adapter"]), plan.adapter_bytes)
                at_rest[key] = (len(raw), kernel.encode(raw))
            raw_size, wire = at_rest[key]
            await instance.send(Frame(Kind.BLOB, GROUP, frame.step, rank=ROLE_STORE, payload=wire), at_ns=frame.due_ns)
            result.loads += 1
            result.raw_bytes += raw_size
            result.wire_bytes += len(wire)
    except (WeightsFailed, BlobError, ValueError, KeyError) as exc:
        result.ok, result.reason = False, str(exc)
        await instance.send_quietly(abort(GROUP, result.reason, rank=ROLE_STORE))
        return result


@dataclass
class RequestRecord:
    adapter: int
    hit: bool
    wire_bytes: int  # the adapter's bytes as the link carried them (0 on a hit)
    wait_s: float  # measured: first token − start − prefill, what the adapter's load delayed it by (0 on a hit)
    ttft_s: float  # measured: arrival to first token


@dataclass
class InstanceResult:
    ok: bool = True
    reason: str = ""
    cold_start_s: float = math.nan
    weights_wire_bytes: int = 0
    requests: list[RequestRecord] = field(default_factory=list)
    late_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "reason": self.reason, "cold_start_s": self.cold_start_s,
                "weights_wire_bytes": self.weights_wire_bytes, "late_s": self.late_s,
                "requests": [r.__dict__ for r in self.requests],
                "ttft_median_s": statistics.median(r.ttft_s for r in self.requests) if self.requests else math.nan}


async def _load(store: Channel, plan: WeightsPlan, kernel: LosslessKernel, step: int, what: dict[str, Any],
                expected: bytes, at_ns: int) -> Frame:
    """Ask the store for `what` at model time `at_ns`, check its bytes, hold them until due."""
    name = "the weights" if what.get("weights") else f"adapter {what['adapter']} (request {step - 1})"
    await store.send(Frame(Kind.LOAD, GROUP, step, rank=ROLE_INSTANCE, payload=json.dumps(what).encode()),
                     at_ns=at_ns)
    frame = await store.receive_or_fail(plan.deadline_s, name, WeightsFailed, "the instance")
    if (frame.kind, frame.step) != (Kind.BLOB, step):
        raise WeightsFailed(f"the instance: expected {name}, got {frame.kind.name} for request {frame.step}")
    kernel.decode(bytes(frame.payload), expected, name)
    await store.hold_until_due(frame)
    return frame


async def run_instance(plan: WeightsPlan, clock: Clock, store: Channel, start_ns: int,
                       expected: bytes) -> InstanceResult:
    """The cold start, then every request in arrival order (module docstring). `expected`: the weights to check
    the cold start's bytes against, made before the clock starts (content.weights)."""
    result, kernel = InstanceResult(), LosslessKernel(plan.kernel)
    lru = AdapterLru(plan.capacity)
    step = WEIGHTS_REQUEST
    try:
        await clock.sleep_until(start_ns)
        got = await _load(store, plan, kernel, step, {"weights": True}, expected, start_ns)
        del expected
        ready = got.due_ns
        result.cold_start_s = (clock.now_ns() - start_ns) / 1e9
        result.weights_wire_bytes = len(got.payload)
        free_at = ready
        prefill_ns = round(plan.prefill_s * 1e9)
        for i, (offset, adapter_id) in enumerate(zip(plan.arrivals_s, plan.adapters, strict=True)):
            step = i + 1
            arrival = ready + round(offset * 1e9)
            start = max(arrival, free_at)
            await clock.sleep_until(start)
            access = lru.access(adapter_id)
            t, wire = start, 0
            if not access.hit:
                got = await _load(store, plan, kernel, step, {"adapter": adapter_id},
                                  content.adapter(adapter_id, plan.adapter_bytes), start)
                t, wire = got.due_ns, len(got.payload)
            free_at = t + prefill_ns
            await clock.sleep_until(free_at)
            first_token = clock.now_ns()
            # The wait the request saw: its first token less its start and its prefill. A blob the host delivered
            # late but within the prefill's hold did not delay it (absolute deadlines), so it is not counted, as
            # TTFT does not count it.
            wait = 0.0 if access.hit else max(0.0, (first_token - start - prefill_ns) / 1e9)
            result.requests.append(RequestRecord(adapter_id, access.hit, wire, wait, (first_token - arrival) / 1e9))
    except (WeightsFailed, BlobError) as exc:
        result.ok, result.reason = False, str(exc)
        await store.send_quietly(abort(GROUP, result.reason, step=step, rank=ROLE_INSTANCE))
        return result
    result.late_s = store.late_ns / 1e9
    await store.send_quietly(Frame(Kind.BYE, GROUP, step, rank=ROLE_INSTANCE))
    return result
