"""The report's `accuracy.model` block (`--kv-sample real`): the real model's reading of the KV that crossed the
link, pooled over the decode instances (agents/decode/model_accuracy.py), with the real tokens each request carried
(the prefill's `real_kv` stats), and the wait for readings still pending when the run's requests are over.

    top1           share of scored tokens whose next-token argmax over the arrived KV equals the one over the sent KV
    kl             mean KL(sent ‖ arrived) per scored token, nats
    ppl, ppl_sent  the continuation's perplexity over the arrived and over the sent KV;
                   ppl_increase = ppl / ppl_sent − 1
    k/v_relative_error   ‖arrived − sent‖ / ‖sent‖ over the real-KV requests' K (and V) values

Sent = what the prefill put on the link (BF16, the wire dtype): codec none over a clean link reads exactly the same
(top1 1, kl 0); realmodel/live.py says why the reference is that and not float32.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from kvtransit.agents.process import Address
from kvtransit.model.scenario import Scenario
from kvtransit.realmodel import live
from kvtransit.report.peer_stats import stat_sum
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


def model_accuracy_block(scenario: Scenario, prefills: list[dict], decodes: list[dict]) -> dict[str, Any]:
    """The pooled figures (module docstring), the requests read and how, and why any was not."""
    blocks = [d["accuracy_model"] for d in decodes if isinstance(d.get("accuracy_model"), dict)]
    sums = {key: stat_sum(blocks, "sums", key) for key in live.SUMS}
    carried: dict[str, Any] = {}
    capped: list[int] = []
    model_names = {b["model"] for b in blocks if b.get("model")}
    for p in prefills:
        real: dict[str, Any] = p["real_kv"] if isinstance(p.get("real_kv"), dict) else {}
        carried.update(real.get("requests", {}))
        capped += real.get("capped", [])
        if real.get("model"):
            model_names.add(real["model"])
    per_request = {rid: {**carried.get(rid, {}), **reading} for b in blocks
                   for rid, reading in b.get("per_request", {}).items()}
    failed = {rid: reason for b in blocks for rid, reason in b.get("failed", {}).items()}
    failures = sorted({b["failure"] for b in blocks if b.get("failure")})
    return {
        "mode": scenario.accuracy,
        "model": ", ".join(sorted(model_names)) or None,
        "requests": scenario.real_kv_requests,
        "measured": len(per_request),
        "pending": int(stat_sum(blocks, "pending")),
        "failed": failed,
        "failures": failures,
        "raw_mismatches": int(stat_sum(blocks, "raw_mismatches")),
        "context_tokens_max": live.CONTEXT_MAX,
        "continuation_tokens": live.CONTINUATION if scenario.accuracy == "model" else None,
        "windows": sorted({w.name for w in map(live.window_for, range(scenario.real_kv_requests))}),
        "scored_tokens": int(sums["scored"]),
        **live.figures(sums),
        "capped_requests": sorted(capped),
        "per_request": dict(sorted(per_request.items(), key=lambda kv: int(kv[0]))),
    }


def model_accuracy_errors(block: dict[str, Any]) -> list[str]:
    """What the report's `errors` say about the real model's reading: asked for and not (all) measured."""
    errors = [f"accuracy model: request {rid} not read: {reason}" for rid, reason in sorted(
        block["failed"].items(), key=lambda kv: int(kv[0]))]
    errors += [f"accuracy model: {failure}" for failure in block["failures"]]
    if block["pending"]:
        errors.append(f"accuracy model: {block['pending']} reading(s) still pending when the report was written")
    if block["measured"] == 0 and not errors:
        errors.append("accuracy model: not measured: no real-KV hand-off reached decode")
    return errors
