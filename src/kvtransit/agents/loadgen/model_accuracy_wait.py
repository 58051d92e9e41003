"""The load generator's wait for the real model's readings (`--kv-sample real`): the workload starts once every decode's
model has loaded, and the report is built once every real-KV hand-off has been read (or a bound has passed); what the
readings say is the report's (report/model_accuracy.py, which documents the figures)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from kvtransit.agents.process import Address
from kvtransit.runtime.clock import Clock, sleep_for
from kvtransit.runtime.http_client import get_json

log = logging.getLogger(__name__)

# How long the report waits for readings still pending once the run is over (host seconds): decode's worker reads a
# request in 0.3-0.6 s on this 2-core box when idle, after loading the model (about 20 s, from decode's start).
PENDING_WAIT_S = 180.0
POLL_S = 0.5


async def _decode_blocks(addresses: Sequence[Address]) -> list[dict[str, Any]]:
    """Every peer's `accuracy_model` /stats block (decode's); a peer that does not answer has none (the report's
    own stats collection names it)."""
    blocks = []
    for address in addresses:
        try:
            stats = await get_json(address.host, address.port, "/stats")
        except (TimeoutError, OSError, ConnectionError, ValueError):
            continue
        if isinstance(stats.get("accuracy_model"), dict):
            blocks.append(stats["accuracy_model"])
    return blocks


async def _poll(addresses: Sequence[Address], clock: Clock,
                done: Callable[[list[dict[str, Any]]], bool]) -> tuple[bool, list[dict[str, Any]]]:
    """Poll the decodes' blocks every POLL_S until `done` says so (True, them) or PENDING_WAIT_S host seconds passed
    (False, the last ones read)."""
    started = time.monotonic()
    while not done(blocks := await _decode_blocks(addresses)):
        if time.monotonic() - started > PENDING_WAIT_S:
            return False, blocks
        await sleep_for(clock, POLL_S)
    return True, blocks


async def wait_for_models(addresses: Sequence[Address], clock: Clock) -> bool:
    """Before the workload starts: poll until every decode's worker has loaded the model (or said why it cannot), so
    that no model loads while the run is timed (it loads at normal priority, beside the prefill's own load, and
    reads hand-offs niced; agents/decode/model_accuracy.py). False if PENDING_WAIT_S passed first."""
    loaded, _ = await _poll(addresses, clock, lambda blocks: all(b.get("loaded") for b in blocks))
    if not loaded:
        log.warning("decode's real model had not loaded after %.0f s; the run starts anyway", PENDING_WAIT_S)
    return loaded


def _pending(blocks: list[dict[str, Any]]) -> int:
    return sum(int(b.get("pending", 0)) for b in blocks)


async def wait_for_readings(addresses: Sequence[Address], clock: Clock) -> int:
    """Once the run's requests are over: poll until no decode has a real-KV reading pending, or PENDING_WAIT_S
    passed; returns how many were still pending (0: all read)."""
    _, blocks = await _poll(addresses, clock, lambda blocks: _pending(blocks) == 0)
    if pending := _pending(blocks):
        log.warning("%d real-model reading(s) still pending after %.0f s; reported as such", pending, PENDING_WAIT_S)
    return pending
