"""Request traces: parse Mooncake-style JSONL and Azure-style CSV, and turn a trace into the request stream.

Formats:
- **mooncake** (kvcache-ai/Mooncake `FAST25-release/traces/`): one JSON object a line, `timestamp` (ms from
  the trace start), `input_length` and `output_length` (tokens), `hash_ids` (prefix-block hashes, kept for
  KV-reuse studies, not used by the replay itself).
- **azure** (Azure LLM inference traces, `AzureLLMInferenceTrace_*.csv`): a header row, then
  `TIMESTAMP,ContextTokens,GeneratedTokens`; TIMESTAMP is an ISO date-time (or a number of seconds).

A real trace rarely fits the emulator as it is (the Mooncake conversation trace is 12,031 requests over an
hour with prompts up to ~100k tokens), so `replay` applies, and `TraceReplay.applied` records, three
adjustments: **sampling** (the first N requests, or N drawn at random in trace order), **time scaling**
(every arrival × time_scale, so 0.1 replays ten times faster) and a **context cap** (prompts longer than the
cap are cut to it, and outputs to at least 1 token).

Pure: parsers take lines and a source name (for errors), never open files.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kvtransit.model.errors import ConfigError
from kvtransit.model.serving.workload import DEFAULT_MAX_TOKENS, RequestSpec

# Tokens per KV block: the Mooncake traces' hash_ids are per 512-token block (kvtransit/data/traces/PROVENANCE.md);
# the prefix cache stores blocks of this size and a prefill chunk holds at least one.
BLOCK_TOKENS = 512
TRACE_FORMATS = ("auto", "mooncake", "azure")
TRACE_SAMPLING = ("first", "random")
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


class TraceError(ConfigError):
    """A trace file that cannot be read as its format: the message names the file and line."""


@dataclass(frozen=True)
class TraceRecord:
    arrival_s: float  # from the trace's first request
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] = ()


def _where(source: str, line: int) -> str:
    return f"{source}, line {line}"


def _whole(value: object, what: str, where: str, *, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not float(value).is_integer() or value < lo:
        raise TraceError(f"{where}: {what} must be a whole number >= {lo}, got {value!r}")
    return int(value)


def parse_mooncake(lines: Iterable[str], source: str = "<trace>") -> list[TraceRecord]:
    """Mooncake JSONL lines → records (arrival from the first request). Blank lines are skipped."""
    records: list[TraceRecord] = []
    first_ms: float | None = None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = _where(source, number)
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{where}: not a JSON object ({exc.msg} at column {exc.colno})") from None
        if not isinstance(obj, dict):
            raise TraceError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        missing = [k for k in ("timestamp", "input_length", "output_length") if k not in obj]
        if missing:
            raise TraceError(f"{where}: missing {', '.join(missing)} (a Mooncake trace line has timestamp, "
                             "input_length, output_length, hash_ids)")
        timestamp = obj["timestamp"]
        if isinstance(timestamp, bool) or not isinstance(timestamp, (int, float)) or not math.isfinite(timestamp) \
                or timestamp < 0:
            raise TraceError(f"{where}: timestamp must be a number of ms >= 0, got {timestamp!r}")
        hash_ids = obj.get("hash_ids", [])
        if not isinstance(hash_ids, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in hash_ids):
            raise TraceError(f"{where}: hash_ids must be a list of integers")
        first_ms = timestamp if first_ms is None else first_ms
        records.append(TraceRecord((timestamp - first_ms) / 1e3,
                                   _whole(obj["input_length"], "input_length", where, lo=1),
                                   _whole(obj["output_length"], "output_length", where, lo=1), tuple(hash_ids)))
    return _in_time_order(records, source)


def _azure_time_s(text: str, where: str) -> float:
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    # Azure's traces print 7 fractional digits ("2023-11-16 18:15:46.6805900"); fromisoformat takes at most 6.
    head, dot, frac = text.partition(".")
    try:
        stamp = datetime.fromisoformat(head)
    except ValueError:
        raise TraceError(f"{where}: TIMESTAMP {text!r} is neither a date-time nor a number of seconds") from None
    fraction = float("0." + frac) if dot and frac.isdigit() else 0.0
    return stamp.timestamp() + fraction


def parse_azure(lines: Iterable[str], source: str = "<trace>") -> list[TraceRecord]:
    """Azure CSV lines (header first) → records (arrival from the first request)."""
    rows = csv.reader(lines)
    header = next(rows, None)
    if header is None:
        raise TraceError(f"{source}: empty file (expected the header {','.join(AZURE_COLUMNS)})")
    header = [h.strip() for h in header]
    missing = [c for c in AZURE_COLUMNS if c not in header]
    if missing:
        raise TraceError(f"{_where(source, 1)}: header lacks {', '.join(missing)} (got {','.join(header)})")
    index = {c: header.index(c) for c in AZURE_COLUMNS}
    records: list[TraceRecord] = []
    first_s: float | None = None
    for row in rows:
        number = rows.line_num
        if not any(cell.strip() for cell in row):
            continue
        where = _where(source, number)
        if len(row) < len(header):
            raise TraceError(f"{where}: {len(row)} fields, the header has {len(header)}")
        t = _azure_time_s(row[index["TIMESTAMP"]], where)
        tokens = []
        for column in ("ContextTokens", "GeneratedTokens"):
            text = row[index[column]].strip()
            try:
                tokens.append(_whole(int(text), column, where, lo=1))
            except ValueError:
                raise TraceError(f"{where}: {column} must be a whole number >= 1, got {text!r}") from None
        first_s = t if first_s is None else first_s
        records.append(TraceRecord(t - first_s, tokens[0], tokens[1]))
    return _in_time_order(records, source)


def _in_time_order(records: list[TraceRecord], source: str) -> list[TraceRecord]:
    if not records:
        raise TraceError(f"{source}: no requests in the trace")
    for i, (a, b) in enumerate(itertools.pairwise(records), start=2):
        if b.arrival_s < a.arrival_s:
            raise TraceError(f"{source}: request {i} arrives before request {i - 1} (a trace must be in time order)")
    return records


# The traces kvtransit ships (kvtransit/data/traces/, PROVENANCE.md there: Mooncake's FAST'25 release, Apache 2.0),
# by the name `--trace` takes for each; workload/trace_file.py finds the file.
SHIPPED_TRACES = {
    "mooncake-conversation": "mooncake_conversation_trace.jsonl.gz",
    "mooncake-synthetic": "mooncake_synthetic_trace.jsonl.gz",
}


def detect_format(path: str) -> str:
    """By name: a shipped trace's own, else by file extension (a trailing .gz aside): .jsonl/.json → mooncake,
    .csv → azure."""
    if path in SHIPPED_TRACES:
        return "mooncake"
    lowered = path.lower().removesuffix(".gz")
    if lowered.endswith((".jsonl", ".json")):
        return "mooncake"
    if lowered.endswith(".csv"):
        return "azure"
    raise TraceError(f"{path}: cannot tell the trace format from the name; give --trace-format mooncake|azure")


def parse_trace(lines: Iterable[str], fmt: str, source: str = "<trace>") -> list[TraceRecord]:
    if fmt == "mooncake":
        return parse_mooncake(lines, source)
    if fmt == "azure":
        return parse_azure(lines, source)
    raise ConfigError(f"trace_format: unknown value {fmt!r} (choose from: {', '.join(TRACE_FORMATS)})")


@dataclass(frozen=True)
class TraceReplay:
    requests: list[RequestSpec]
    applied: dict[str, Any] = field(default_factory=dict)  # what was done to the trace, for the report
    # The requests before the window (trace_start), each (hash_ids, prompt tokens) capped as the window's are:
    # the window's past, which flows/tier/prefix_warm.py replays into a pool.
    earlier: list[tuple[tuple[int, ...], int]] = field(default_factory=list)


def replay(records: list[TraceRecord], *, requests: int, time_scale: float = 1.0, sampling: str = "first",
           context_cap: int = DEFAULT_MAX_TOKENS, seed: int = 1, source: str = "<trace>",
           start: int = 0) -> TraceReplay:
    """The request stream of a trace: `requests` of them from its request `start` on (the next N, or N at random
    kept in trace order), arrivals × `time_scale` from the first one kept, prompts capped at `context_cap`
    tokens. The requests before `start` are the window's past (flows/tier/prefix_warm.py warms a pool with them)."""
    if sampling not in TRACE_SAMPLING:
        raise ConfigError(f"trace_sample: unknown value {sampling!r} (choose from: {', '.join(TRACE_SAMPLING)})")
    if not (time_scale > 0 and math.isfinite(time_scale)):
        raise ConfigError(f"time_scale: must be > 0, got {time_scale!r}")
    if context_cap < 1:
        raise ConfigError(f"context_cap: must be >= 1 token, got {context_cap!r}")
    if not 0 <= start < len(records):
        raise ConfigError(f"trace_start: request {start} is outside {source}'s {len(records)} requests "
                          f"(give 0..{len(records) - 1})")
    n = min(requests, len(records) - start)
    if sampling == "first":
        chosen = records[start:start + n]
    else:
        chosen = [records[i] for i in sorted(random.Random(seed).sample(range(start, len(records)), n))]
    t0 = chosen[0].arrival_s
    specs, capped = [], 0
    for request_id, record in enumerate(chosen):
        prompt, hash_ids = _capped(record, context_cap)
        capped += prompt < record.input_tokens
        specs.append(RequestSpec(request_id, (record.arrival_s - t0) * time_scale, prompt, record.output_tokens,
                                 hash_ids))
    span_s = chosen[-1].arrival_s - t0
    applied = {
        "trace": source,
        "trace_requests": len(records),
        "sampling": f"{sampling} {n} of {len(records)}" + (f" from request {start}" if start else ""),
        "start": start,
        "requests": n,
        "time_scale": time_scale,
        "trace_span_s": span_s,
        "replay_span_s": span_s * time_scale,
        "context_cap": context_cap,
        "prompts_capped": capped,
        "mean_rate_rps": (n - 1) / (span_s * time_scale) if span_s > 0 else None,
    }
    earlier = [(ids, prompt) for prompt, ids in (_capped(record, context_cap) for record in records[:start])]
    return TraceReplay(specs, applied, earlier)


def _capped(record: TraceRecord, context_cap: int) -> tuple[int, tuple[int, ...]]:
    """(prompt tokens, hash_ids) of `record` with its prompt cut to `context_cap`: the ids kept for prefix reuse
    (flows/tier/prefix.py) are the blocks the capped prompt still covers."""
    prompt = min(record.input_tokens, context_cap)
    blocks = -(-prompt // 512)  # Mooncake's 512-token blocks (PROVENANCE.md)
    return prompt, record.hash_ids[:blocks]
