"""`kvtransit accuracy --select | --ring`: query-aware page selection and ring attention measured offline on the
real-KV sample (or synthetic KV) (numpy only, no extra). The mode flags and the shared KV loading are
`accuracy.py`'s; this file runs the two flows and writes their tables (and, with --markdown, a results page).
"""

from __future__ import annotations

import shlex
import sys

from kvtransit.cli._common import CliError, print_json, print_table
from kvtransit.cli.accuracy import RING_CODECS, fmt, load_kv, numbers, write_text

NEEDLE_CONTEXTS: tuple[int, ...] = (1024, 4096, 16384, 65536)
NEEDLE_TRIALS = 8
# The planted key's strength (kernels/selection.py: needle_context): 1.5·√D along the query, so its logit is
# ≈ 12 at D = 64 against N(0, 1) for the others; 1.0 (≈ 8) is the harder needle.
NEEDLE_STRENGTHS: tuple[float, ...] = (1.0, 1.5)
NEEDLE_HEAD_DIM = 64  # SmolLM2's head_dim, as the real-KV sample
SELECT_INTRO = (
    "Query-aware selection (Quest arXiv:2406.10774, docs/reference.md §7.5), measured offline by "
    "`kernels/selection.py`. The context's keys (after RoPE, as the cache holds them) are cut into pages; each page "
    "is summarised by its mean key (`mean`: scoring is one dot product, 1.00 op/B of MAC, in the module's set) or "
    "by Quest's element-wise min and max (`minmax`: the bound Σ max(q·min, q·max) needs a max, so the host). For "
    "each decode query and kv head the pages are scored (with GQA, the mean's score is the group's summed query "
    "against the summary; Quest's bounds are summed over the group), the host keeps the top ⌈budget × pages⌉ "
    "(ties to the lower page) and attention runs over those pages plus the tokens after the last whole page. "
    "Scores are computed at `precision_bits`: the query, each summary vector and the scores are rounded to a "
    "symmetric grid of 2^bits steps over each vector's largest |value| (the quantiser band-keep's precision model "
    "uses); at 4 bits many pages tie, and ties go to the lower page, which favours page 0. `sink page kept` "
    "forces page 0 (the attention sinks, docs/reference.md §6) into the budget. The real-KV sample is short "
    "(384 tokens, 24 pages), so 1/16 of it is 2 pages; the needle runs to 65,536 tokens on synthetic keys.")
RING_INTRO = (
    "Ring attention (Liu et al. arXiv:2310.01889, docs/reference.md §7.6), measured offline by "
    "`kernels/ring_attention.py`. The context's KV is split into n equal blocks, one a rank; each query belongs to "
    "the rank holding its position; a rank folds the blocks in as they arrive with an online softmax (running max "
    "and sum), so without a codec the result is full attention (first table of each text). With a codec on the "
    "ring's links, each block in flight is encoded and decoded once per hop (cast to the wire dtype, the "
    "middlebox's own `get_codec(...).encode/.decode`), so the block rank i sees from rank j has been through it "
    "(i − j) mod n times; band-keep with `bits` draws fresh analogue noise each hop. `out err h hops` is the "
    "attention-output error when every block has gone h hops, against exact attention; 1 hop is one pass.")


class _Table:
    """One printed table: what `print_table` takes, and what the Markdown page renders."""

    def __init__(self, title: str, columns, rows, caption: str) -> None:
        self.title, self.columns, self.rows, self.caption = title, tuple(columns), [tuple(r) for r in rows], caption


def _bits_list(text: str | None) -> list[int | None]:
    from kvtransit.kernels.selection import PRECISION_BITS, check_precision_bits

    if text is None:
        return list(PRECISION_BITS)
    out: list[int | None] = []
    for part in (x.strip() for x in text.split(",") if x.strip()):
        try:
            bits = None if part == "full" else int(part)
        except ValueError:
            raise CliError(f"--score-bits: {part!r} is neither an integer nor 'full' (e.g. 4,6,8,full)") from None
        check_precision_bits(bits)
        out.append(bits)
    if not out:
        raise CliError(f"--score-bits: no value in {text!r}")
    return out


def _bits_name(bits: int | None) -> str:
    return "full" if bits is None else f"{bits}b"


def _ring_codec_specs(text: str | None) -> list[tuple[str, dict]]:
    """NAME[/keep=F][/sinks=N][/bits=N][/block=N] → (label, get_codec keyword arguments)."""
    from kvtransit.kernels.registry import CODEC_NAMES

    kinds = {"keep": ("keep", float), "sinks": ("sinks", int), "bits": ("precision_bits", int), "block": ("block", int)}
    specs = []
    for label in (x.strip() for x in (text.split(",") if text is not None else RING_CODECS) if x.strip()):
        name, *settings = label.split("/")
        if name not in CODEC_NAMES or name == "none":
            raise CliError(f"--ring-codecs: unknown codec {name!r} in {label!r} "
                           f"(choose from: {', '.join(c for c in CODEC_NAMES if c != 'none')})")
        params: dict = {"name": name}
        for setting in settings:
            key, _, value = setting.partition("=")
            if key not in kinds:
                raise CliError(f"--ring-codecs: unknown setting {key!r} in {label!r} (choose from: {', '.join(kinds)})")
            field, kind = kinds[key]
            try:
                params[field] = kind(value)
            except ValueError:
                raise CliError(f"--ring-codecs: {setting!r} in {label!r} is not a {kind.__name__}") from None
        specs.append((label, params))
    if not specs:
        raise CliError(f"--ring-codecs: no codec in {text!r}")
    return specs


def _flows_command(args) -> str:
    argv = ["kvtransit", "accuracy"]
    for flag in ("select", "ring"):
        if getattr(args, flag):
            argv.append("--" + flag)
    for flag in ("sample", "synthetic", "layers", "page_size", "page_budgets", "score_bits", "needle_contexts",
                 "needle_trials", "ring_sizes", "ring_codecs", "markdown"):
        value = getattr(args, flag)
        if value is not None:
            argv += ["--" + flag.replace("_", "-"), str(value)]
    if args.dtype != "bfloat16":
        argv += ["--dtype", args.dtype]
    return shlex.join(argv)


def run_flows(args) -> int:
    samples, source = load_kv(args)
    say = None if args.no_progress else (lambda msg: print(msg, file=sys.stderr, flush=True))
    tables: list[_Table] = []
    data: dict = {"command": _flows_command(args), "kv": source}
    if args.select:
        data["selection"] = _selection(args, samples, source, tables, say)
    if args.ring:
        data["ring"] = _ring(args, samples, source, tables, say)
    if args.markdown:
        write_text(args.markdown, _flows_markdown(args, data["command"], tables))
    if args.json:
        print_json(data)
        return 0
    for t in tables:
        print_table(t.title, t.columns, t.rows, caption=t.caption)
    return 0


def _selection(args, samples, source: str, tables: list[_Table], say) -> dict:
    from kvtransit.kernels import selection as sel

    page_size = sel.DEFAULT_PAGE_SIZE if args.page_size is None else args.page_size
    budgets = numbers(args.page_budgets, "--page-budgets", float, list(sel.BUDGETS))
    for b in budgets:
        sel.pages_for_budget(1, b)  # a budget of 0 or above 1 fails here, with the valid values
    bits_list = _bits_list(args.score_bits)
    out: dict = {"page_size": page_size, "budgets": budgets, "score_bits": bits_list, "texts": {}, "needle": []}
    columns = ["summary", "sink page", "budget", "pages"]
    for bits in bits_list:
        columns += [f"recall {_bits_name(bits)}", f"out err {_bits_name(bits)}"]
    for text, sample in samples.items():
        if sample.q is None or sample.q_positions is None:
            raise CliError(f"--select: the KV of {text!r} has no decode queries to select for")
        sel.check_page_size(sample.k.shape[2], page_size)
        rows, records = [], []
        for kind in sel.SUMMARY_KINDS:
            for sinks in (0, 1):
                for budget in budgets:
                    if say:
                        say(f"select: {text} {kind} sink={sinks} budget={budget:g}")
                    row = [kind, "kept" if sinks else "-", f"1/{1 / budget:g}", ""]
                    for bits in bits_list:
                        q = sel.evaluate_selection(sample.q, sample.k, sample.v, sample.q_positions, budget,
                                                   kind=kind, page_size=page_size, precision_bits=bits,
                                                   sink_pages=sinks)
                        row[3] = f"{q.chosen:.1f}/{q.pages:.1f}"
                        row += [f"{q.recall:.3f}", f"{q.output_error:.3f}"]
                        records.append({"kind": kind, "sink_pages": sinks, "budget": budget, "precision_bits": bits,
                                        "recall": q.recall, "output_error": q.output_error, "pages": q.pages,
                                        "chosen": q.chosen})
                    rows.append(row)
        out["texts"][text] = records
        layers, q_heads, tq, _ = sample.q.shape
        tables.append(_Table(
            f"page selection on {text}: {source}, {layers} layers, {sample.k.shape[1]} kv / {q_heads} query heads, "
            f"{sample.k.shape[2]} tokens, {tq} decode queries at positions {int(sample.q_positions.min())}.."
            f"{int(sample.q_positions.max())}, pages of {page_size}",
            columns, rows,
            "recall = attention mass on the chosen pages / on all whole pages; out err = ‖O_sel − O‖/‖O‖ of "
            "softmax(qKᵀ/√d)V (float64); one selection per kv head and query; the tokens after the last whole page "
            "are always attended; pages = chosen/whole pages (mean over queries); sink page kept = page 0 forced "
            "within the budget; scores at precision_bits (operands and result rounded, kernels/selection.py)"))
    out["needle"] = _needle(args, page_size, bits_list, tables, say)
    return out


def _needle(args, page_size: int, bits_list, tables: list[_Table], say) -> list[dict]:
    from statistics import median

    from kvtransit.kernels import selection as sel

    contexts = numbers(args.needle_contexts, "--needle-contexts", int, list(NEEDLE_CONTEXTS))
    trials = NEEDLE_TRIALS if args.needle_trials is None else args.needle_trials
    if trials < 1:
        raise CliError(f"--needle-trials must be >= 1, got {trials}")
    budget = 1 / 16  # the needle's budget: 1/16 of the pages (docs/reference.md §7.5)
    rows, records = [], []
    for context in contexts:
        sel.check_page_size(context, page_size)
        for strength in NEEDLE_STRENGTHS:
            for kind in sel.SUMMARY_KINDS:
                if say:
                    say(f"needle: {context} tokens, strength {strength:g}, {kind}")
                row: list = [f"{context:,}", f"{strength:g}", kind, ""]
                for bits in bits_list:
                    found = [sel.needle_trial(*sel.needle_context(context, NEEDLE_HEAD_DIM, seed, strength), budget,
                                              kind=kind, page_size=page_size, precision_bits=bits)
                             for seed in range(trials)]
                    row[3] = f"{found[0].chosen}/{found[0].pages}"
                    hits = sum(f.found for f in found)
                    row += [f"{hits}/{trials}", f"{median(f.rank for f in found):g}"]
                    records.append({"context": context, "strength": strength, "kind": kind, "precision_bits": bits,
                                    "found": hits, "trials": trials, "ranks": [f.rank for f in found]})
                rows.append(row)
    columns = ["context", "strength", "summary", "pages"]
    for bits in bits_list:
        columns += [f"found {_bits_name(bits)}", f"median rank {_bits_name(bits)}"]
    tables.append(_Table(
        f"needle at budget 1/16: synthetic KV (white Gaussian keys, head_dim {NEEDLE_HEAD_DIM}, one head), "
        f"pages of {page_size}, {trials} seeds a context",
        columns, rows,
        "a key strength·√D along the query planted at a seeded token (logit ≈ strength·√D = 8 or 12, the others "
        "≈ N(0, 1)); found = its page among the chosen; rank 0 = the best-scored page"))
    return records


def _ring(args, samples, source: str, tables: list[_Table], say) -> dict:
    from kvtransit.kernels import ring_attention as ring

    sizes = numbers(args.ring_sizes, "--ring-sizes", int, list(ring.RING_SIZES))
    specs = _ring_codec_specs(args.ring_codecs)
    out: dict = {"sizes": sizes, "codecs": [label for label, _ in specs], "texts": {}}
    hmax = max(sizes) - 1
    for text, sample in samples.items():
        if sample.q is None or sample.q_positions is None:
            raise CliError(f"--ring: the KV of {text!r} has no decode queries")
        q, pos, k, v = sample.q, sample.q_positions, sample.k, sample.v
        exact = ring.full_attention(q, pos, k, v)
        checks, rows, records = [], [], []
        for n in sizes:
            result = ring.ring_attention(q, pos, k, v, n)
            checks.append((str(n), str(result.hops_per_layer), f"{k.shape[2] // n}",
                           f"{ring.relative_l2(exact, result.output):.2e}"))
            if n < 2:
                continue
            for label, params in specs:
                if say:
                    say(f"ring: {text} n={n} {label}")
                params = dict(params)
                errors = ring.error_after_hops(q, pos, k, v, n, ring.wire_codec(params.pop("name"), args.dtype,
                                                                               **params))
                after = list(errors.after_hops) + [None] * (hmax - len(errors.after_hops))
                rows.append([str(n), label, f"{errors.kv_after_hops[0]:.4f}", f"{errors.kv_after_hops[-1]:.4f}",
                             *(fmt(x) for x in after), fmt(errors.ring),
                             f"{errors.after_hops[-1] / errors.one_pass:.3f}"])
                records.append({"n": n, "codec": label, "after_hops": list(errors.after_hops), "ring": errors.ring,
                                "kv_after_hops": list(errors.kv_after_hops)})
        out["texts"][text] = {"exact": [dict(zip(("n", "hops_per_layer", "block_tokens", "rel_err"), c, strict=True))
                                        for c in checks], "codecs": records}
        layers, q_heads, tq, _ = q.shape
        what = (f"{text}: {source}, {layers} layers, {k.shape[1]} kv / {q_heads} query heads, {k.shape[2]} tokens, "
                f"{tq} decode queries at positions {int(pos.min())}..{int(pos.max())}")
        tables.append(_Table(f"ring attention without a codec vs full attention, {what}",
                             ("n", "hops per layer", "block tokens", "rel. L2 vs full"), checks,
                             "float64; online softmax over the blocks in ring order (kernels/ring_attention.py)"))
        tables.append(_Table(
            f"ring attention, a codec once per hop, {what}, wire {args.dtype}",
            ("n", "codec", "KV err 1 hop", "KV err n-1 hops", *(f"out err {h} hop{'s' if h > 1 else ''}"
                                                                for h in range(1, hmax + 1)),
             "out err ring", "n-1 hops / one pass"), rows,
            "out err h hops = ‖O − O_h‖/‖O‖ with every KV block through the codec h times (1 hop = one pass, the "
            "codec applied once); ring = the ring's own output (the queries' rank holds the last block: block j "
            "arrives after n−1−j hops, its own block exact); KV err = ‖KV_h − KV‖/‖KV‖; each block in flight is one "
            "frame [layers, K/V, kv heads, block tokens, D], so band-keep keeps each block's first 4 tokens exact"))
    return out


def _flows_markdown(args, command: str, tables: list[_Table]) -> str:
    def cell(x) -> str:
        return str(x).replace("|", "\\|")

    what = " and ".join(x for x, on in (("query-aware KV selection", args.select), ("ring attention", args.ring))
                        if on)
    lines = [f"# Accuracy of {what}", "", "Made by:", "", "```", command, "```", ""]
    if args.select:
        lines += [SELECT_INTRO, ""]
    if args.ring:
        lines += [RING_INTRO, ""]
    for t in tables:
        lines += [f"**{t.title}**", "", "| " + " | ".join(map(cell, t.columns)) + " |",
                  "|" + "|".join(["---"] + ["---:"] * (len(t.columns) - 1)) + "|"]
        lines += ["| " + " | ".join(map(cell, row)) + " |" for row in t.rows]
        lines += ["", t.caption, ""]
    return "\n".join(lines)
