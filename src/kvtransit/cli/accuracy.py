"""`kvtransit accuracy`: how much a codec costs in reconstruction and attention error (REFERENCE §6).

Runs on the committed real-KV sample (SmolLM2-135M) by default, or on synthetic KV with --synthetic, and
prints one table per text: the codec beside exact, equal-memory token subsampling, int8 and int4.
"""

from __future__ import annotations

from pathlib import Path

from ._common import CliError, add_json_flag, print_json, print_table

SAMPLE_NAME = "smollm2_kv_sample.npz"


def default_sample_path() -> Path:
    """tests/data/smollm2_kv_sample.npz under the working directory, else under the source checkout."""
    here = Path("tests/data") / SAMPLE_NAME
    if here.exists():
        return here
    return Path(__file__).resolve().parents[3] / "tests" / "data" / SAMPLE_NAME


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
    p.set_defaults(func=run)


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.4f}"


def run(args) -> int:
    from dataclasses import replace

    from kvtransit.kernels.accuracy import accuracy_table, load_sample, synthetic_sample

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
                    [(r.method, r.setting, f"{r.bytes_ratio:.3f}", _fmt(r.k_err), _fmt(r.k_err_centred),
                      _fmt(r.v_err), _fmt(r.v_err_centred), _fmt(r.attn_err)) for r in rows],
                    caption="relative errors (Frobenius); centred = each block's per-channel mean removed")
    return 0
