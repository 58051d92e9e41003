"""The real-model results as tables (title, columns, rows, caption) and as Markdown. No torch: reads the dicts
`end_to_end.run` and `needle.run` return (or a results file's)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvtransit.model.judge.task_accuracy import PPL_INCREASE_TOLERANCE


@dataclass(frozen=True)
class Table:
    title: str
    columns: tuple[str, ...]
    rows: list[tuple[str, ...]]
    caption: str


def _pct(x: float) -> str:
    return f"{x:+.2%}"


def _model_line(model: dict[str, Any]) -> str:
    return f"{model['name']} ({model['weights']}; computed in {model['compute_dtype']})"


def end_to_end_table(results: dict[str, Any]) -> Table:
    texts = list(results["exact"]["per_text"])
    columns = ("codec", "bytes kept", "ppl", "ppl vs exact", *(f"ppl vs exact, {t}" for t in texts),
               "KL nats/token", "top-1 agree", f"within +{PPL_INCREASE_TOLERANCE:.0%}")
    exact = results["exact"]
    rows = [("exact (float32 cache)", "1.000", f"{exact['ppl']:.3f}", "-", *("-" for _ in texts), "0", "100.0%",
             "-")]
    for r in results["rows"]:
        rows.append((r["spec"], f"{r['bytes_ratio']:.3f}", f"{r['ppl']:.3f}", _pct(r["ppl_increase"]),
                     *(_pct(r["per_text"][t]["ppl_increase"]) if t in r["per_text"] else "-" for t in texts),
                     f"{r['kl']:.3g}", f"{r['top1']:.1%}",
                     "yes" if r["ppl_increase_worst_text"] <= PPL_INCREASE_TOLERANCE else "no"))
    windows = ", ".join(f"{w['text']}@{w['offset']}" for w in results["windows"])
    w0 = results["windows"][0]
    exact_texts = "; ".join(f"{t} {exact['per_text'][t]['ppl']:.3f}" for t in texts)
    caption = (f"windows (text@token offset): {windows}; each {w0['context']} context tokens prefilled exactly, "
               f"{w0['continuation']} teacher-forced and scored. Exact perplexity: {exact_texts}. "
               f"{results['keys_note']}. Within +{PPL_INCREASE_TOLERANCE:.0%}: the worst text's increase.")
    title = (f"end-to-end accuracy: {_model_line(results['model'])}, wire {results['wire_dtype']}, "
             f"keys after RoPE unless marked pre-rope")
    return Table(title, columns, rows, caption)


def needle_table(results: dict[str, Any]) -> Table:
    contexts = results["contexts"]
    arms = [a["name"] for a in results["arms"]]
    columns = ("received cache", *(f"{c['context']} tok" for c in contexts), "bytes kept (longest)")
    rows = []
    for arm in arms:
        cells = tuple(f"{c['arms'][arm]['correct']}/{c['arms'][arm]['trials']}" for c in contexts)
        ratio = contexts[-1]["arms"][arm]["bytes_ratio"] if contexts else None
        rows.append((arm, *cells, "-" if ratio is None else f"{ratio:.3f}"))
    lengths = "; ".join(f"{c['context']}: {', '.join(map(str, c['tokens']))}" for c in contexts)
    caption = (f"exact-match retrieval of a 5-digit pass key ({results['prompt']['source']}), depths "
               f"{', '.join(f'{d:g}' for d in results['depths'])} x seeds {', '.join(map(str, results['seeds']))} per "
               f"context; prompt tokens: {lengths}. First answer token from the exact prefill, the digits decoded "
               f"greedily over the received cache; select/pages=f keeps that fraction of {results['page_size']}-token "
               f"pages (mean-key summaries scored by the last prompt query, first and last page always kept).")
    return Table(f"needle in a haystack: {_model_line(results['model'])}, wire {results['wire_dtype']}",
                 columns, rows, caption)


def _markdown_table(table: Table) -> str:
    head = "| " + " | ".join(table.columns) + " |"
    rule = "|" + "|".join("---" if i == 0 else "---:" for i in range(len(table.columns))) + "|"
    body = ["| " + " | ".join(row) + " |" for row in table.rows]
    return "\n".join([f"**{table.title}**", "", head, rule, *body, "", table.caption])


_PREFACE_TEXT = (
    "What each codec of the middlebox does to a real model's predictions, measured offline on CPU by "
    "`kvtransit accuracy` (kvtransit/realmodel/). End to end: each window's context is prefilled exactly; every "
    "layer's cached K (after RoPE, as the cache holds it and the middlebox ships it) and V is cast to the wire "
    "dtype and put through the codec with the middlebox's own functions (`get_codec(...).encode`, then `.decode`, "
    "one layer per chunk); the continuation is teacher-forced over that cache, its own KV computed by the decoder "
    "in full precision. The reference is the model's own float32 cache (`exact`): `none` therefore shows what the "
    "bfloat16 wire alone costs. KL is KL(exact || codec) in nats per scored token; top-1 is the share of scored "
    "tokens whose argmax matches the exact cache's. Token subsampling keeps exactly as many tokens as band-keep's "
    "payload has rows at the same keep and sinks (equal bytes; kvtransit/realmodel/kv_codecs.py). "
    f"`within +{PPL_INCREASE_TOLERANCE:.0%}` is what the five tests' precision test reads "
    "(`kvtransit verdict --accuracy-results docs/results/accuracy.json REPORT.json`): the worst text's perplexity "
    "increase at most 1 %."
)
PREFACE: tuple[str, ...] = (_PREFACE_TEXT,)


def markdown(*, command: str, end_to_end: dict[str, Any] | None, needle: dict[str, Any] | None,
             preface: Sequence[str] = PREFACE) -> str:
    """A results page: what was run (the command), on what (model file, digest, versions), and the tables."""
    parts = ["# Accuracy of the codecs on a real model", "", *preface, "", "Made by:", "", "```", command, "```", ""]
    model = (end_to_end or needle or {}).get("model")
    if model:
        versions = ", ".join(f"{k} {v}" for k, v in model["versions"].items())
        line = (f"Model: `{model['name']}` ({model['bytes']:,} bytes, SHA-256 `{model['sha256']}`), "
                f"{model['weights']}; {model['layers']} layers, {model['q_heads']}/{model['kv_heads']} heads, "
                f"head_dim {model['head_dim']}, max_position_embeddings {model['max_position_embeddings']}; "
                f"{model['threads']} torch threads; {versions}.")
        parts += [line, ""]
    if end_to_end is not None:
        texts = "; ".join(f"`{t['name']}` = {t['path']} ({t['tokens']:,} tokens, SHA-256 `{t['sha256'][:16]}…`"
                          + (f", Python {t['python']}" if "python" in t else "") + ")"
                          for t in end_to_end["texts"].values())
        parts += ["## Perplexity, KL and top-1 agreement", "", f"Texts: {texts}.", "",
                  _markdown_table(end_to_end_table(end_to_end)), "",
                  f"Run time: {end_to_end['seconds']:.0f} s (after loading the model).", ""]
    if needle is not None:
        parts += ["## Needle in a haystack", "", _markdown_table(needle_table(needle)), "",
                  f"Run time: {needle['seconds']:.0f} s (after loading the model).", ""]
    return "\n".join(parts)
