"""What a codec costs a real model, as the five tests' precision test reads it. Pure: no I/O.

`kvtransit accuracy --end-to-end --results FILE` (kvtransit/realmodel/) measures, for every codec setting, the
perplexity of a real model (SmolLM2-135M) teacher-forced over a KV cache that went through the codec, against
the same model over the exact cache. Each row of that file is keyed by `codec_key`, which a run's scenario
gives too, so the precision test can find the row for the kernel a run put on its link
(`task_loss_from_results`; the CLI reads the file, this module only looks in what it read).

The tolerance: a lossy KV codec is "within tolerance" when it raises perplexity by at most 1 % over the exact
cache (kvtransit's threshold for KV, docs/reference.md §8.2; KVQuant's bar for 3-bit KV was under 0.1 perplexity on
models of about 5–6 perplexity, i.e. about 1–2 %, docs/reference.md §5), on the worst of the texts measured, so a codec
that is fine on prose but not on code is not within it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvtransit.model.errors import ConfigError

# "≤ 1 % perplexity increase = within tolerance for KV" (see the module docstring).
PPL_INCREASE_TOLERANCE = 0.01
RESULTS_KIND = "kvtransit-accuracy-end-to-end"
RESULTS_VERSION = 1
# The middlebox ships the cache as the model holds it: keys after RoPE.
KEYS_POST_ROPE = "post-rope"
KEYS_PRE_ROPE = "pre-rope"
BAND_KEEP = "freq-keep-k"
SUBSAMPLE = "subsample"


def _num(x: float) -> str:
    return format(float(x), "g")


def codec_key(codec: str, *, keep: float | None = None, block: int | None = None, sinks: int | None = None,
              variant: str | None = None, precision_bits: int | None = None, keys: str = KEYS_POST_ROPE) -> str:
    """One string per codec setting, the same whether a results row or a run's scenario asks.

    Band-keep names every parameter that changes its output (variant, keep, block, sinks, precision_bits, and
    whether keys were compressed before or after RoPE); fp8 its block; token subsampling the band-keep setting
    whose bytes it matches; the rest (none, fp4-block, kivi-2, kivi-3) have no free parameter."""
    if codec == BAND_KEEP:
        if keep is None or block is None or sinks is None or variant is None:
            raise ConfigError(f"codec_key: {BAND_KEEP} needs keep, block, sinks and variant")
        bits = "none" if precision_bits is None else str(precision_bits)
        return (f"{BAND_KEEP} variant={variant} keep={_num(keep)} block={block} sinks={sinks} "
                f"precision_bits={bits} keys={keys}")
    if codec == SUBSAMPLE:
        if keep is None or block is None or sinks is None:
            raise ConfigError(f"codec_key: {SUBSAMPLE} needs keep, block and sinks (the band-keep bytes it matches)")
        return f"{SUBSAMPLE} bytes-of-keep={_num(keep)} block={block} sinks={sinks}"
    if codec == "fp8":
        if block is None:
            raise ConfigError("codec_key: fp8 needs its block (values per scale)")
        return f"fp8 block={block}"
    return codec


@dataclass(frozen=True)
class MeasuredTaskLoss:
    """One codec's measured cost to a real model, as the precision test reads it.

    `ppl_increase`: the worst text's perplexity over the codec'd cache / over the exact cache − 1. `source`:
    one line saying which model, texts, windows and file it was measured on."""

    key: str
    ppl_exact: float
    ppl: float
    ppl_increase: float
    kl: float | None
    top1: float | None
    tokens: int
    source: str

    @property
    def within_tolerance(self) -> bool:
        return self.ppl_increase <= PPL_INCREASE_TOLERANCE


def _number(row: Mapping[str, Any], name: str, where: str, *, optional: bool = False) -> float | None:
    value = row.get(name)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"{where}: row {row.get('key')!r}: {name} must be a finite number, got {value!r}")
    return float(value)


def task_loss_from_results(results: Any, key: str, *, where: str) -> MeasuredTaskLoss | None:
    """The row of `results` (a parsed results file; `where` names it in errors) for codec `key`, or None when the
    file has no such row. A file that is not a results file, or a row without its numbers, is a ConfigError."""
    if not isinstance(results, Mapping) or results.get("kind") != RESULTS_KIND:
        raise ConfigError(f"{where}: not an end-to-end accuracy results file (no \"kind\": \"{RESULTS_KIND}\"; "
                          f"write one with kvtransit accuracy --end-to-end --results FILE)")
    if results.get("version") != RESULTS_VERSION:
        raise ConfigError(f"{where}: results version {results.get('version')!r}, this kvtransit reads "
                          f"{RESULTS_VERSION}")
    rows = results.get("rows")
    if not isinstance(rows, list):
        raise ConfigError(f"{where}: no \"rows\" list")
    row = next((r for r in rows if isinstance(r, Mapping) and r.get("key") == key), None)
    if row is None:
        return None
    ppl_exact = _number(row, "ppl_exact", where)
    ppl = _number(row, "ppl", where)
    increase = _number(row, "ppl_increase_worst_text", where)
    tokens = row.get("tokens")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise ConfigError(f"{where}: row {key!r}: tokens must be a whole number >= 1, got {tokens!r}")
    assert ppl_exact is not None and ppl is not None and increase is not None  # not optional above
    source = results.get("source")
    return MeasuredTaskLoss(key=key, ppl_exact=ppl_exact, ppl=ppl, ppl_increase=increase,
                            kl=_number(row, "kl", where, optional=True),
                            top1=_number(row, "top1", where, optional=True), tokens=tokens,
                            source=f"{source if isinstance(source, str) else 'a real model'} ({where})")
