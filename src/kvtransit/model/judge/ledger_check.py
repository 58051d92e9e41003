"""The request ledger and its checker: did every request end exactly once, with its own tokens? (Jepsen style)

The load generator appends one JSON object per line to the run's ledger (`ledger.jsonl`) as things happen,
and never rewrites a line. Record kinds (`"ev"`):

    {"ev": "sent", "id": 7, "output": 32, "prefill": 0}           a Request went out
    {"ev": "tokens", "src": "decode-0", "entries": [[7, 1], [9, 4]]}   token entries, as received (index 0,
                                                                  the first token, comes from the prefill)
    {"ev": "kv_ready", "id": 7, "src": "decode-0", "t": 12.5}     decode took the KV and admitted the request
    {"ev": "outcome", "id": 7, "outcome": "ok", "reason": null, "t": 13.0}   the request ended (ok, slo-miss,
                                                                  failed, timed-out); failed carries its reason
    (`t`: the host's CLOCK_MONOTONIC, seconds)
    {"ev": "peer", "role": "decode", "name": "decode-0", "kv_content_mismatches": 0}   an agent's own count
    {"ev": "counters", "requests": {"ok": 9, "failed": 1, ...}}  the client's Prometheus requests counter

`check(records)` is pure: it takes the parsed records and says what went wrong.

- lost: sent, and no outcome.
- duplicated: two outcomes for one request, one token index delivered twice, or the KV admitted twice (two
  token streams).
- cross-delivered: a token for a request never sent, an index beyond the request's output length, or a token
  after the request finished ok: tokens that belonged to another request's stream.
- corrupted: KV whose content did not match what was sent, yet was used (decode checks the sampled requests
  byte for byte against the regenerated reference and reports the count in its `peer` record).
- failed without a reason: a failed outcome whose reason is empty.
- counters: the outcome tally must equal the client's own Prometheus counter (when a `counters` record exists).

Tokens that arrive after a request was already failed or timed out are `late_tokens`: not a safety violation
(the request's outcome stands), but worth seeing.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvtransit.model.errors import ConfigError

OUTCOMES = ("ok", "slo-miss", "failed", "timed-out")
RECORD_KINDS = ("sent", "tokens", "kv_ready", "outcome", "peer", "counters")
FINISHED_OK = ("ok", "slo-miss")
LEDGER_FILE = "ledger.jsonl"
_ADDRESS = re.compile(r"\[?[0-9a-fA-F.:]+\]?:\d+")
_NUMBER = re.compile(r"\d+(\.\d+)?")
# One ledger line, parsed: {"ev": kind, ...} (agents/loadgen/ledger_writer.py writes them).
Record = dict[str, Any]


@dataclass
class LedgerVerdict:
    requests: int = 0
    outcomes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    failed_reasons: dict[str, int] = field(default_factory=dict)
    lost: list[int] = field(default_factory=list)  # request ids
    duplicated: list[int] = field(default_factory=list)
    # (request id, token index or None for an outcome, why)
    cross_delivered: list[tuple[int, int | None, str]] = field(default_factory=list)
    corrupted: int = 0
    failed_without_reason: list[int] = field(default_factory=list)
    late_tokens: int = 0
    counter_mismatches: dict[str, tuple[int, int]] = field(default_factory=dict)  # outcome -> (ledger, counter)

    @property
    def ok(self) -> bool:
        """No safety violation: nothing lost, duplicated, cross-delivered or corrupted; every failure has a
        reason; the counters agree."""
        return not (self.lost or self.duplicated or self.cross_delivered or self.corrupted
                    or self.failed_without_reason or self.counter_mismatches)

    def summary(self) -> dict[str, Any]:
        return {"requests": self.requests, "ok": self.outcomes["ok"], "slo_miss": self.outcomes["slo-miss"],
                "failed": dict(self.failed_reasons), "failed_total": self.outcomes["failed"],
                "timed_out": self.outcomes["timed-out"], "lost": len(self.lost),
                "duplicated": len(self.duplicated), "cross_delivered": len(self.cross_delivered),
                "corrupted": self.corrupted, "failed_without_reason": len(self.failed_without_reason),
                "late_tokens": self.late_tokens, "counter_mismatches": dict(self.counter_mismatches)}

    def problems(self) -> list[str]:
        """One line per violation kind, naming the first few request ids."""
        out = []
        for name, items in (("lost", self.lost), ("duplicated", self.duplicated),
                            ("cross-delivered", self.cross_delivered),
                            ("failed without a reason", self.failed_without_reason)):
            if items:
                out.append(f"{len(items)} {name}: {items[:5]}")
        if self.corrupted:
            out.append(f"{self.corrupted} requests used corrupted KV")
        for outcome, (ledger, counter) in self.counter_mismatches.items():
            out.append(f"outcome {outcome}: ledger {ledger}, Prometheus counter {counter}")
        return out


def parse(lines: Iterable[str], source: str = "ledger") -> list[Record]:
    """The records of a ledger's lines; a malformed line is a ConfigError naming it. A torn last line (the
    writer died mid-write) is the one thing tolerated: appends are line-sized, so only the tail can tear."""
    lines = list(lines)
    records: list[Record] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            if number == len(lines) and not line.endswith("\n"):
                break
            raise ConfigError(f"{source} line {number} is not JSON: {exc}") from None
        if not isinstance(record, dict) or record.get("ev") not in RECORD_KINDS:
            raise ConfigError(f"{source} line {number}: expected an object with ev in {RECORD_KINDS}, "
                              f"got {line.strip()[:80]!r}")
        records.append(record)
    return records


def check(records: Iterable[Record]) -> LedgerVerdict:
    verdict = LedgerVerdict()
    output_of: dict[int, int] = {}
    outcomes: dict[int, list[Record]] = {}
    ended_at: dict[int, str] = {}  # id -> outcome, once the first outcome is recorded
    seen_tokens: dict[int, set[int]] = {}
    admitted: Counter[int] = Counter()
    duplicated: set[int] = set()
    counters: dict[str, Any] | None = None
    for record in records:
        kind = record["ev"]
        if kind == "sent":
            output_of[record["id"]] = record["output"]
        elif kind == "tokens":
            for rid, index in record["entries"]:
                _token(verdict, rid, index, output_of, ended_at, seen_tokens, duplicated)
        elif kind == "kv_ready":
            admitted[record["id"]] += 1
            if admitted[record["id"]] > 1:
                duplicated.add(record["id"])
        elif kind == "outcome":
            rid = record["id"]
            outcomes.setdefault(rid, []).append(record)
            ended_at.setdefault(rid, record["outcome"])
        elif kind == "peer":
            verdict.corrupted += int(record.get("kv_content_mismatches") or 0)
        elif kind == "counters":
            counters = record["requests"]
    verdict.requests = len(output_of)
    for rid in output_of:
        ends = outcomes.get(rid, [])
        if not ends:
            verdict.lost.append(rid)
            continue
        if len(ends) > 1:
            duplicated.add(rid)
        outcome = ends[0]["outcome"]
        verdict.outcomes[outcome] = verdict.outcomes.get(outcome, 0) + 1
        if outcome == "failed":
            reason = ends[0].get("reason") or ""
            if not reason.strip():
                verdict.failed_without_reason.append(rid)
            key = reason_class(reason)
            verdict.failed_reasons[key] = verdict.failed_reasons.get(key, 0) + 1
    for rid in outcomes:
        if rid not in output_of:
            verdict.cross_delivered.append((rid, None, "outcome for a request never sent"))
    verdict.duplicated = sorted(duplicated)
    if counters is not None:
        for outcome in OUTCOMES:
            ledger, counted = verdict.outcomes.get(outcome, 0), int(counters.get(outcome, 0))
            if ledger != counted:
                verdict.counter_mismatches[outcome] = (ledger, counted)
    return verdict


def _token(verdict: LedgerVerdict, rid: int, index: int, output_of: dict[int, int], ended_at: dict[int, str],
           seen: dict[int, set[int]], duplicated: set[int]) -> None:
    if rid not in output_of:
        verdict.cross_delivered.append((rid, index, "token for a request never sent"))
        return
    if not 0 <= index < output_of[rid]:
        verdict.cross_delivered.append((rid, index, f"index beyond the output length {output_of[rid]}"))
        return
    outcome = ended_at.get(rid)
    if outcome in FINISHED_OK:
        verdict.cross_delivered.append((rid, index, f"token after the request finished ({outcome})"))
        return
    if outcome is not None:
        verdict.late_tokens += 1
        return
    indices = seen.setdefault(rid, set())
    if index in indices:
        duplicated.add(rid)
    indices.add(index)


def reason_class(reason: str) -> str:
    """A failure reason's kind, for tables: its text before the first ": " (the detail), with addresses and
    numbers blanked so one kind of failure is one row."""
    head = _ADDRESS.sub("ADDR", reason.split(": ")[0].strip())
    return _NUMBER.sub("N", head)[:60] or "(no reason)"


def first_after(records: Iterable[Record], kind: str, t: float) -> float | None:
    """The earliest `t` of a `kind` record at or after `t` (None if there is none): e.g. when the hand-off path
    first worked again after a fault."""
    times = [r["t"] for r in records if r["ev"] == kind and r.get("t") is not None and r["t"] >= t]
    return min(times) if times else None


def read(path: str | Path) -> LedgerVerdict:
    """Check the ledger file at `path` (the only I/O here is reading the text the caller points at)."""
    with open(path, encoding="utf-8") as handle:
        return check(parse(handle, str(path)))

