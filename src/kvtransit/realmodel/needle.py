"""Needle in a haystack: a planted pass key, retrieved with each codec and with query-aware page selection.

The prompt is the pass-key retrieval test of Mohtashami & Jaggi (arXiv:2305.16300, the one LongLoRA and others
reuse): an instruction, filler sentences, "The pass key is NNNNN. Remember it. NNNNN is the pass key." at a
given depth of the filler, more filler, then "What is the pass key? The pass key is". The context is built in
the tokenizer's tokens, whole filler sentences only, to at most the asked length (the tables give the real one).

Each trial prefills the prompt exactly, as the prefill GPU would; its last position's prediction is the first
answer token (the prefill's own token, from the exact cache, as in disaggregated serving). Decode then runs
greedily over the cache it received: the exact one, the cache through a codec (kv_codecs.py, the middlebox's
codecs at the wire dtype), or only the pages a query-aware selection keeps. SmolLM2 writes a number digit by
digit (" 2", "7", ...: the first answer token is the space), so every digit is decoded over the received cache.
A trial is right when the digits that follow are exactly the pass key (`steps` = the key's tokens + 1, so a
longer number is caught).

Selection (Quest, arXiv:2406.10774, with a MAC-only page summary; docs/reference.md §7): the context's keys (after
RoPE, as the cache holds them) are cut into pages of 16 tokens, each page summarised by its mean key
(kernels/page_scoring.py: `page_representatives`); per layer and kv head, the page scores are the dot
products of the last prompt position's queries (after RoPE) with the summaries (`score_pages`), summed over
the query heads that read that kv head (GQA); the host keeps the first page (the attention sinks, docs/reference.md
§6), the last page (the question) and the best-scoring others up to the budget (a fraction of the pages), and
sends those pages only, at the wire dtype. The selection is made once, at the hand-off, from the prompt's
last query (a link can only carry what was chosen when it was sent); decode then attends to the kept pages
and to its own new tokens.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from kvtransit.kernels.page_scoring import page_representatives, score_pages
from kvtransit.model.judge.task_accuracy import KEYS_POST_ROPE
from kvtransit.realmodel import kv_codecs
from kvtransit.realmodel.errors import RealModelError
from kvtransit.realmodel.kv_codecs import CodecSpec

if TYPE_CHECKING:  # torch only where a trial runs: the prompt, keys and page selection need none
    import torch

    from kvtransit.realmodel.session import LayerKV, Session

Progress = Callable[[str], None]

RESULTS_KIND = "kvtransit-accuracy-needle"
INTRO = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
         "I will quiz you about the important information there.\n")
FILLER = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = " The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = "\nWhat is the pass key? The pass key is"
# Where the needle sits, as a fraction of the filler before it; two keys per depth (seeds 1 and 2).
DEPTHS: tuple[float, ...] = (0.1, 0.5, 0.9)
SEEDS: tuple[int, ...] = (1, 2)
FIRST_CONTEXT = 512
PAGE_SIZE = 16  # Quest's page (docs/reference.md §7)
PAGE_BUDGETS: tuple[float, ...] = (0.125, 0.25, 0.5)  # fractions of the context's pages sent
EXACT = "exact"


@dataclass(frozen=True)
class Arm:
    """What decode gets: the exact cache, the cache through a codec, or the selected pages at a budget."""

    name: str
    spec: CodecSpec | None = None
    budget: float | None = None


def default_specs() -> list[CodecSpec]:
    """Every requantiser; band-keep at docs/reference.md §6's FreqKV setting (dct, keep 0.5, 4 sinks) and around it;
    subsampling at its bytes. (Shorter than the end-to-end grid: a needle trial at 8,192 tokens costs a minute.)"""
    specs = [kv_codecs.requantiser(n) for n in kv_codecs.REQUANTISERS]
    specs += [kv_codecs.band_keep("dct", k, kv_codecs.FREQKV_SINKS) for k in kv_codecs.KEEPS]
    specs += [kv_codecs.band_keep("dct", 0.5, 0), kv_codecs.band_keep("fft", 0.5, kv_codecs.FREQKV_SINKS)]
    return [*specs, kv_codecs.subsample(0.5, kv_codecs.FREQKV_SINKS)]


def default_arms() -> list[Arm]:
    """Exact, `default_specs()`, and selection at PAGE_BUDGETS."""
    return arms_from(default_specs(), PAGE_BUDGETS)


def arms_from(specs: Sequence[CodecSpec], budgets: Sequence[float]) -> list[Arm]:
    """The exact cache, each spec's cache, and page selection at each budget (a fraction of the pages)."""
    for s in specs:
        if s.keys != KEYS_POST_ROPE:
            raise RealModelError(f"needle: {s.name} compresses keys before RoPE; only --end-to-end measures that")
    for b in budgets:
        if not 0 < b <= 1:
            raise RealModelError(f"--page-budgets: each budget must be a fraction in (0, 1], got {b}")
    return [Arm(EXACT)] + [Arm(s.name, spec=s) for s in specs] + [Arm(f"select/pages={b:g}", budget=b) for b in budgets]


def default_contexts(limit: int) -> list[int]:
    """512, then ×4 each step, and the model's limit itself: 512, 2048, 8192 for SmolLM2's 8192."""
    out, c = [], FIRST_CONTEXT
    while c < limit:
        out.append(c)
        c *= 4
    return [*out, limit]


def pass_key(seed: int, depth: float) -> str:
    """A five-digit key, fixed by the seed and the depth."""
    return str(random.Random(f"{seed}:{depth}").randint(10000, 99999))


def build_prompt(tokenize: Callable[[str], list[int]], context: int, depth: float, key: str) -> list[int]:
    """Instruction, filler, the needle at `depth` of the filler, filler, question: at most `context` tokens."""
    intro, filler, question = tokenize(INTRO), tokenize(FILLER), tokenize(QUESTION)
    needle = tokenize(NEEDLE.format(key=key))
    room = context - len(intro) - len(needle) - len(question)
    units = room // len(filler)
    if units < 1:
        raise RealModelError(f"needle: a context of {context} tokens has no room for filler (the instruction, needle "
                             f"and question take {context - room})")
    before = round(depth * units)
    return intro + filler * before + needle + filler * (units - before) + question


def select_pages(keys: np.ndarray, queries: np.ndarray, budget: float, page_size: int = PAGE_SIZE) -> np.ndarray:
    """Token indices [kv_heads, kept] a query-aware selection sends (module docstring), sorted per head.

    keys [kv_heads, tokens, D]; queries [q_heads, D] of the last position, after RoPE."""
    kv_heads, tokens, _ = keys.shape
    group = queries.shape[0] // kv_heads
    summaries = page_representatives(keys, page_size)  # [kv_heads, pages, D]
    pages = summaries.shape[1]
    scores = score_pages(queries.reshape(kv_heads, group, -1), summaries[:, None]).sum(axis=1)  # [kv_heads, pages]
    keep = min(pages, max(2, round(budget * pages)))
    forced = np.zeros(pages, bool)
    forced[[0, pages - 1]] = True
    ranked = np.where(forced, np.inf, scores)  # the host ranks (comparisons are not the module's: docs/reference.md §5)
    chosen = np.sort(np.argsort(-ranked, axis=1, kind="stable")[:, :keep], axis=1)
    out = []
    for head in range(kv_heads):
        idx = np.concatenate([np.arange(p * page_size, min((p + 1) * page_size, tokens)) for p in chosen[head]])
        out.append(idx)
    return np.stack(out)


def _answer(text: str, key: str) -> tuple[str, bool]:
    found = re.match(r"\s*(\d+)", text)
    got = found.group(1) if found else ""
    return got or text.strip()[:12], got == key


def _arm_cache(session: Session, arm: Arm, wire_rows: list[np.ndarray], pre_cache: list[LayerKV],
               queries: list[torch.Tensor] | None) -> tuple[list[LayerKV], float]:
    """The cache decode gets for `arm`, and the bytes it moved / the raw hand-off's."""
    import torch

    kv = session.kv_heads
    if arm.spec is None and arm.budget is None:
        return pre_cache, 1.0
    if arm.spec is not None:
        outcome = kv_codecs.apply(arm.spec, wire_rows)
        if outcome.layers is None:
            kept = torch.from_numpy(outcome.kept)
            sent_rows = [torch.from_numpy(r.astype(np.float32)) for r in wire_rows]
            return [(r[:kv, kept].contiguous(), r[kv:, kept].contiguous()) for r in sent_rows], outcome.bytes_ratio
        decoded = [torch.from_numpy(r.astype(np.float32)) for r in outcome.layers]
        return [(r[:kv].contiguous(), r[kv:].contiguous()) for r in decoded], outcome.bytes_ratio
    assert arm.budget is not None and queries is not None
    out, sent, total = [], 0, 0
    for rows, (k_exact, _), q in zip(wire_rows, pre_cache, queries, strict=True):
        idx = select_pages(k_exact.numpy(), q.numpy(), arm.budget)  # scored on the prefill's own keys
        r = rows.astype(np.float32)
        k = np.take_along_axis(r[:kv], idx[:, :, None], axis=1)
        v = np.take_along_axis(r[kv:], idx[:, :, None], axis=1)
        out.append((torch.from_numpy(np.ascontiguousarray(k)), torch.from_numpy(np.ascontiguousarray(v))))
        sent += idx.size
        total += kv * r.shape[1]
    return out, sent / total


def run(session: Session, contexts: Sequence[int], arms: Sequence[Arm], *, depths: Sequence[float] = DEPTHS,
        seeds: Sequence[int] = SEEDS, wire_dtype: str = "bfloat16", progress: Progress | None = None) -> dict[str, Any]:
    """Every arm on every (context, depth, seed); exact-match accuracy per context and arm, as a JSON-able dict."""
    import torch

    say = progress or (lambda _msg: None)
    for c in contexts:
        session.check_length(c, "needle context")
    for d in depths:
        if not 0 <= d <= 1:
            raise RealModelError(f"--depths: each depth must be a fraction in [0, 1], got {d}")
    started = time.monotonic()
    selecting = any(a.budget is not None for a in arms)
    table = []
    for c in contexts:
        tally: dict[str, dict[str, Any]] = {a.name: {"correct": 0, "trials": 0, "answers": [], "bytes_ratio": None}
                                            for a in arms}
        lengths = set()
        for depth in depths:
            for seed in seeds:
                key = pass_key(seed, depth)
                ids = build_prompt(session.tokenize, c, depth, key)
                steps = len(session.tokenize(f" {key}"))  # the space comes from the prefill; digits + 1 decoded
                session.check_length(len(ids) + steps, "needle context and answer")
                lengths.add(len(ids))
                t0 = time.monotonic()
                pre = session.prefill(ids, last_query=selecting)
                first = int(pre.logits[-1].argmax())
                wire = [kv_codecs.to_wire(torch.cat([k, v]).numpy(), wire_dtype) for k, v in pre.cache]
                for arm in arms:
                    cache, ratio = _arm_cache(session, arm, wire, pre.cache, pre.last_queries)
                    text = session.decode_text([first, *session.greedy(cache, first, len(ids), steps)])
                    got, right = _answer(text, key)
                    entry = tally[arm.name]
                    entry["correct"] += int(right)
                    entry["trials"] += 1
                    entry["answers"].append({"depth": depth, "key": key, "answer": got, "right": right})
                    entry["bytes_ratio"] = ratio
                say(f"needle context {c} depth {depth:g} key {key}: {len(arms)} arms in {time.monotonic() - t0:.1f} s "
                    f"(exact: {tally[EXACT]['answers'][-1]['answer'] if EXACT in tally else '-'})")
        table.append({"context": c, "tokens": sorted(lengths), "arms": tally})
    return {"kind": RESULTS_KIND, "model": session.describe(), "wire_dtype": wire_dtype,
            "prompt": {"intro": INTRO, "filler": FILLER, "needle": NEEDLE, "question": QUESTION,
                       "source": "pass-key retrieval, Mohtashami & Jaggi, arXiv:2305.16300"},
            "depths": list(depths), "seeds": list(seeds), "page_size": PAGE_SIZE,
            "arms": [{"name": a.name, "spec": None if a.spec is None else a.spec.key, "page_budget": a.budget}
                     for a in arms],
            "contexts": table, "seconds": time.monotonic() - started}
