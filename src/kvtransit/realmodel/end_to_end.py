"""Perplexity, KL and top-1 agreement of a real model over a codec'd KV cache.

Per window (texts.py): prefill the context exactly (one forward pass, from position 0); take every layer's
cached K (after RoPE, as the cache holds it and the middlebox ships it) and V; cast them to the wire dtype
(bfloat16, as the prefill sends them); run them through the codec (kv_codecs.py: the middlebox's own codec
functions, encode then decode, a layer per chunk); then teacher-force the continuation over that cache and
score each position's prediction of the next token of the text. The same continuation over the exact float32
cache is the reference ("exact"): each codec's perplexity is set beside exact's, and

    KL    = mean over scored tokens of KL(p_exact ‖ p_codec) = Σ_v p_exact(v)·(log p_exact(v) − log p_codec(v)), nats
    top-1 = share of scored tokens whose argmax over the codec'd cache equals the argmax over the exact cache
    ppl   = exp(mean negative log-likelihood of the text's own next tokens)

pooled over all windows of a text (per text) and over every window (all); `ppl_increase_worst_text` is the
largest per-text ppl / exact ppl − 1 (what the precision test reads, model/judge/task_accuracy.py). The exact
reference is the model's own float32 cache, so codec `none` shows what the bfloat16 wire alone costs.

As in disaggregated serving, the continuation's own KV is computed by the decoder over the received cache, in
full precision: only the handed-off context goes through the codec. The exact prefill is reused by every codec
of a window; torch runs in inference mode on the session's threads (2 on this machine), numpy's codecs in
between.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from kvtransit.model.judge.task_accuracy import (
    KEYS_POST_ROPE,
    KEYS_PRE_ROPE,
    PPL_INCREASE_TOLERANCE,
    RESULTS_KIND,
    RESULTS_VERSION,
)
from kvtransit.realmodel import kv_codecs
from kvtransit.realmodel.kv_codecs import CodecSpec
from kvtransit.realmodel.session import LayerKV, Session
from kvtransit.realmodel.texts import Window, describe_text, read_text, window_tokens

Progress = Callable[[str], None]


@dataclass
class _Tally:
    """Sums over scored tokens of one text (or all)."""

    nll: float = 0.0
    kl: float = 0.0
    agree: int = 0
    tokens: int = 0
    wire_bytes: int = 0
    raw_bytes: int = 0

    def add(self, other: _Tally) -> None:
        self.nll += other.nll
        self.kl += other.kl
        self.agree += other.agree
        self.tokens += other.tokens
        self.wire_bytes += other.wire_bytes
        self.raw_bytes += other.raw_bytes

    @property
    def ppl(self) -> float:
        return math.exp(self.nll / self.tokens)


@dataclass
class _Scores:
    per_text: dict[str, _Tally] = field(default_factory=dict)

    def tally(self, text: str) -> _Tally:
        return self.per_text.setdefault(text, _Tally())

    @property
    def pooled(self) -> _Tally:
        out = _Tally()
        for t in self.per_text.values():
            out.add(t)
        return out


def score(logits: torch.Tensor, exact_logp: torch.Tensor, exact_top: torch.Tensor, targets: torch.Tensor) -> _Tally:
    """Sums of NLL of `targets`, KL(exact ‖ these) and top-1 agreement with exact over the rows of `logits`."""
    logp = logits.double().log_softmax(-1)
    nll = -logp.gather(-1, targets[:, None]).sum()
    kl = (exact_logp.exp() * (exact_logp - logp)).sum()
    agree = (logits.argmax(-1) == exact_top).sum()
    return _Tally(float(nll), float(kl), int(agree), int(targets.numel()))


def wire_rows(keys: Sequence[torch.Tensor], values: Sequence[LayerKV], wire_dtype: str) -> list[np.ndarray]:
    """Per layer [2·kv_heads, tokens, head_dim] (K heads, then V heads: kv_frames.as_rows) in the wire dtype."""
    return [kv_codecs.to_wire(torch.cat([k, v], dim=0).numpy(), wire_dtype)
            for k, (_, v) in zip(keys, values, strict=True)]


def _cache(session: Session, spec: CodecSpec, outcome: kv_codecs.Outcome, wire_rows: list[np.ndarray],
           tokens: int) -> list[LayerKV]:
    """The decoder's cache after `spec`: decoded rows back to float32 K and V (keys re-rotated if the codec saw
    them before RoPE), or for subsampling the kept tokens of the wire-dtype cache."""
    kv = session.kv_heads
    if outcome.layers is None:  # subsampling: the kept tokens, as they crossed the wire
        kept = torch.from_numpy(outcome.kept)
        out = []
        for rows in wire_rows:
            t = torch.from_numpy(rows.astype(np.float32))
            out.append((t[:kv, kept].contiguous(), t[kv:, kept].contiguous()))
        return out
    out = []
    positions = torch.arange(tokens)
    for rows in outcome.layers:
        t = torch.from_numpy(rows.astype(np.float32))
        k, v = t[:kv], t[kv:]
        if spec.keys == KEYS_PRE_ROPE:
            k = session.rotate(k, positions)
        out.append((k.contiguous(), v.contiguous()))
    return out


def run(session: Session, windows: Sequence[Window], specs: Sequence[CodecSpec], *, wire_dtype: str = "bfloat16",
        progress: Progress | None = None) -> dict[str, Any]:
    """Every spec over every window; the results as a JSON-able dict (report.py renders it)."""
    say = progress or (lambda _msg: None)
    started = time.monotonic()
    texts: dict[str, list[int]] = {}
    text_info = {}
    for w in windows:
        if w.text not in texts:
            body = read_text(w.text)
            texts[w.text] = session.tokenize(body)
            text_info[w.text] = describe_text(w.text, body, len(texts[w.text]))
        session.check_length(w.context + w.continuation, f"window {w.name}")
        window_tokens(w, texts[w.text])  # every window is checked before the first is run
    exact = _Scores()
    scores = {spec.key: _Scores() for spec in specs}
    pre_rope = any(spec.keys == KEYS_PRE_ROPE for spec in specs)
    for wi, w in enumerate(windows):
        ids = window_tokens(w, texts[w.text])
        context, inputs, targets = ids[:w.context], ids[w.context:-1], torch.tensor(ids[w.context + 1:])
        positions = list(range(w.context, w.context + w.continuation))
        t0 = time.monotonic()
        pre = session.prefill(context, keys_pre_rope=pre_rope)
        exact_logits = session.forward_over(pre.cache, inputs, positions)
        exact_logp = exact_logits.double().log_softmax(-1)
        exact_top = exact_logits.argmax(-1)
        exact.tally(w.text).add(score(exact_logits, exact_logp, exact_top, targets))
        wire = {KEYS_POST_ROPE: wire_rows([k for k, _ in pre.cache], pre.cache, wire_dtype)}
        if pre.keys_pre_rope is not None:
            wire[KEYS_PRE_ROPE] = wire_rows(pre.keys_pre_rope, pre.cache, wire_dtype)
        say(f"window {wi + 1}/{len(windows)} {w.name}: exact prefill and continuation in {time.monotonic() - t0:.1f} s")
        for si, spec in enumerate(specs):
            t1 = time.monotonic()
            outcome = kv_codecs.apply(spec, wire[spec.keys])
            cache = _cache(session, spec, outcome, wire[KEYS_POST_ROPE], w.context)
            tally = score(session.forward_over(cache, inputs, positions), exact_logp, exact_top, targets)
            tally.wire_bytes, tally.raw_bytes = outcome.wire_bytes, outcome.raw_bytes
            scores[spec.key].tally(w.text).add(tally)
            say(f"window {wi + 1}/{len(windows)} {w.name}: codec {si + 1}/{len(specs)} {spec.name} in "
                f"{time.monotonic() - t1:.1f} s")
    return _results(session, windows, specs, wire_dtype, exact, scores, text_info, time.monotonic() - started)


def _summary(s: _Tally, ref: _Tally | None) -> dict[str, Any]:
    out: dict[str, Any] = {"ppl": s.ppl, "tokens": s.tokens}
    if ref is not None:
        out |= {"ppl_increase": s.ppl / ref.ppl - 1, "kl": s.kl / s.tokens, "top1": s.agree / s.tokens}
    return out


def _results(session: Session, windows: Sequence[Window], specs: Sequence[CodecSpec], wire_dtype: str,
             exact: _Scores, scores: dict[str, _Scores], text_info: dict[str, Any], seconds: float) -> dict[str, Any]:
    model = session.describe()
    by_text = {text: _summary(t, None) for text, t in exact.per_text.items()}
    rows = []
    for spec in specs:
        s = scores[spec.key]
        per_text = {text: _summary(t, exact.per_text[text]) for text, t in s.per_text.items()}
        pooled = s.pooled
        rows.append({"spec": spec.name, "key": spec.key, "codec": spec.codec, "keep": spec.keep, "sinks": spec.sinks,
                     "variant": spec.variant, "block": spec.block, "precision_bits": spec.precision_bits,
                     "keys": spec.keys, "bytes_ratio": pooled.wire_bytes / pooled.raw_bytes,
                     **_summary(pooled, exact.pooled), "ppl_exact": exact.pooled.ppl,
                     "ppl_increase_worst_text": max(v["ppl_increase"] for v in per_text.values()),
                     "per_text": per_text})
    texts = ", ".join(sorted(text_info))
    source = (f"{model['name']} ({model['weights']}), {len(windows)} window(s) of {windows[0].context} + "
              f"{windows[0].continuation} tokens over {texts}, wire {wire_dtype}")
    return {"kind": RESULTS_KIND, "version": RESULTS_VERSION, "source": source, "model": model,
            "wire_dtype": wire_dtype, "keys_note": "keys are compressed after RoPE, as the model's cache holds them "
            "and the middlebox ships them, except rows marked pre-rope (FreqKV's setting: the k_proj output is "
            "compressed, then rotated by the decoder)",
            "texts": text_info,
            "windows": [{"text": w.text, "offset": w.offset, "context": w.context, "continuation": w.continuation,
                         "scored_tokens": w.continuation} for w in windows],
            "exact": {**_summary(exact.pooled, None), "per_text": by_text},
            "rows": rows, "seconds": seconds,
            "tolerance": {"ppl_increase": PPL_INCREASE_TOLERANCE}}

