"""`kvtransit candidates`: the candidate table (docs/reference.md §8), measured live, one short scenario per row.

    kvtransit candidates --out docs/results
    kvtransit candidates --only pq-key-exchange,weight-streaming --module-budget high --link eth-100g

Rows: kv-tier-fetch, kv-handoff, query-aware-selection, ring-attention, moe-all-to-all, tp-all-reduce,
weight-streaming, fhe-inference, pq-key-exchange (`--only` picks some). Each row runs its flow for a few seconds
(`harness/studies/candidates/run.py` says what runs and what is modelled), its five tests (bottleneck, operations,
budget, precision, placement) are judged from the run, and one rule gives the verdict: candidate (all five pass),
promising (one measured failure that one change of an unknown below fixes), no kernel (the row's kernel moves no
byte and computes nothing), not a candidate, or not run (an extra missing).

The unknowns change the table the way docs/reference.md §5's unknowns would: --module-budget (low 0.40, sim 1.6, high
3.96, or a number of ops per line byte), --transform-charged (the transform counts against the budget),
--precision-bits N (the analogue path's bits; the lossy rows are measured at them), --link NAME (every row on that
catalogued link). Written: OUT/candidates.md, .json and .png (the plots extra), OUT/candidates-spec.md, each row's
evidence under OUT/candidates/<row>/ (its small report, its regime's heat-map and live points), each row's run under
OUT/runs/ and the command reproducing it, and "what would flip each verdict": per unknown, the nearest change that
changes it.

Regimes (--regimes live, the default): each row's operating conditions (load × link for the hand-off and the tier,
context × page budget for selection, TP size × batch for the sum, ring size × link, adapters × capacity, ...) mapped
by the model, then confirmed live at a point on each side of the frontier; --regimes model maps without live
points, off skips them; --regime-axis ROW:KEY=V1,V2 sets one axis's values (the row's catalogue only).

    kvtransit candidates --spec [--module-budget N --module-pj-per-bit P --module-latency-us L --precision-bits B]

prints each flow's break-even module (the ops per line byte, pJ per bit, added latency and precision bits at which
the kernel in transit beats the same kernel on the GPU and the next faster link at equal power) without running
anything; with a module's figures, whether it reaches each.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from kvtransit.cli._common import CliError, add_json_flag, print_json, print_table


def register(subparsers) -> None:
    p = subparsers.add_parser("candidates", help="the candidate table: every flow's five tests, measured live",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default=None, metavar="NAME[,NAME...]", help="run only these rows (default: all)")
    p.add_argument("--module-budget", default="sim", metavar="BUDGET",
                   help="ops per line byte: low (0.40), sim (1.6), high (3.96) or a number (default sim)")
    p.add_argument("--transform-charged", action="store_true",
                   help="the transform counts against the budget (default: each kernel's own declaration)")
    p.add_argument("--precision-bits", type=int, default=None, metavar="N",
                   help="the analogue path's bits, 1..32 (default: exact)")
    p.add_argument("--link", default=None, metavar="NAME", help="every row on this link (default: each row's own)")
    p.add_argument("--sample", type=Path, default=None, metavar="PATH",
                   help="the real-KV sample (default tests/data/smollm2_kv_sample.npz)")
    p.add_argument("--out", type=Path, default=Path("runs/candidates"), metavar="DIR",
                   help="where the table and each row's run go (default runs/candidates)")
    p.add_argument("--runs", type=Path, default=None, metavar="DIR",
                   help="where each row's run goes (default OUT/runs; runs/ is ignored by git)")
    p.add_argument("--regimes", choices=("live", "model", "off"), default="live",
                   help="map each row's regime by the model and confirm it live (live, default), by the model only "
                        "(model), or not at all (off)")
    p.add_argument("--regime-axis", action="append", default=None, metavar="ROW:KEY=V1,V2",
                   help="one axis of a row's regime (repeatable), e.g. kv-handoff:rate=4,8,12")
    p.add_argument("--spec", action="store_true",
                   help="print each flow's break-even module (what the hardware would need) and run nothing")
    p.add_argument("--module-pj-per-bit", type=float, default=None, metavar="P",
                   help="with --spec: the module's energy, pJ per input bit (default the sim's 1)")
    p.add_argument("--module-latency-us", type=float, default=None, metavar="L",
                   help="with --spec: the module's added latency, µs (default the sim's 1)")
    add_json_flag(p)
    p.set_defaults(func=run)


def unknowns_from_args(args: argparse.Namespace):
    from kvtransit.harness.studies.candidates.table import Unknowns
    from kvtransit.model.field_checks import module_budget
    from kvtransit.model.module.budget import MODULE_BUDGETS

    budget = module_budget(args.module_budget)
    value = MODULE_BUDGETS[budget] if isinstance(budget, str) else float(budget)
    return Unknowns(module_budget=value, transform_charged=True if args.transform_charged else None,
                    precision_bits=args.precision_bits, link=args.link)


def _command(args: argparse.Namespace) -> str:
    argv = ["kvtransit", "candidates"]
    if args.only:
        argv += ["--only", args.only]
    if args.module_budget != "sim":
        argv += ["--module-budget", str(args.module_budget)]
    if args.transform_charged:
        argv.append("--transform-charged")
    if args.precision_bits is not None:
        argv += ["--precision-bits", str(args.precision_bits)]
    if args.link:
        argv += ["--link", args.link]
    if args.sample:
        argv += ["--sample", str(args.sample)]
    argv += ["--out", str(args.out)]
    if args.runs:
        argv += ["--runs", str(args.runs)]
    if args.regimes != "live":
        argv += ["--regimes", args.regimes]
    for axis in args.regime_axis or []:
        argv += ["--regime-axis", axis]
    return shlex.join(argv)


def module_spec_from_args(args: argparse.Namespace):
    """The module to hold against the spec sheet (None: none given), each figure checked (one line names a bad one)."""
    from kvtransit.harness.studies.candidates.spec import ModuleSpec
    from kvtransit.model.module.budget import SIM_ADDED_LATENCY_S, SIM_PJ_PER_INPUT_BIT

    given = (args.module_budget != "sim" or args.module_pj_per_bit is not None or args.module_latency_us is not None
             or args.precision_bits is not None)
    pj = SIM_PJ_PER_INPUT_BIT if args.module_pj_per_bit is None else args.module_pj_per_bit
    latency = SIM_ADDED_LATENCY_S if args.module_latency_us is None else args.module_latency_us * 1e-6
    if args.module_latency_us is not None and args.module_latency_us < 0:
        raise CliError(f"--module-latency-us must be a number >= 0, got {args.module_latency_us!r}")
    spec = ModuleSpec(unknowns_from_args(args).module_budget, pj, latency, args.precision_bits)
    return spec if given else None


def run_spec(args: argparse.Namespace) -> int:
    from kvtransit.harness.studies.candidates.report import spec_markdown
    from kvtransit.harness.studies.candidates.rows import all_rows
    from kvtransit.harness.studies.candidates.spec import meets, spec_sheet

    names = candidate_names_checked(args.only)
    module = module_spec_from_args(args)
    sheet = [be for be in spec_sheet(all_rows()) if be.flow in names]
    if args.json:
        print_json([{**be.as_dict(), **({"this_module": meets(be, module)} if module else {})} for be in sheet])
        return 0
    print(spec_markdown(sheet, module, command=_spec_command(args)), end="")
    return 0


def candidate_names_checked(text: str | None) -> tuple[str, ...]:
    from kvtransit.harness.studies.candidates.rows import candidate_names

    return candidate_names(text)


def _spec_command(args: argparse.Namespace) -> str:
    argv = ["kvtransit", "candidates", "--spec"]
    if args.only:
        argv += ["--only", args.only]
    for flag, value in (("--module-budget", None if args.module_budget == "sim" else args.module_budget),
                        ("--module-pj-per-bit", args.module_pj_per_bit),
                        ("--module-latency-us", args.module_latency_us),
                        ("--precision-bits", args.precision_bits)):
        if value is not None:
            argv += [flag, str(value)]
    return shlex.join(argv)


def run(args: argparse.Namespace) -> int:
    import time

    from kvtransit.harness.studies.candidates.report import row_cells, table_json, unknowns_text, write_table
    from kvtransit.harness.studies.candidates.rows import all_rows
    from kvtransit.harness.studies.candidates.run import default_sample_path, parse_axes, run_rows
    from kvtransit.harness.studies.candidates.spec import spec_sheet
    from kvtransit.harness.studies.candidates.verdicts import judge_table

    if args.spec:
        return run_spec(args)
    names = candidate_names_checked(args.only)  # every input checked before anything runs
    unknowns = unknowns_from_args(args)
    axes = parse_axes(args.regime_axis, names)
    module_spec_from_args(args)
    sample = args.sample or default_sample_path()
    if not sample.exists():
        raise CliError(f"no KV sample at {sample} (pass --sample PATH)")
    command = _command(args)
    began = time.monotonic()
    runs = run_rows(names, unknowns, args.runs or args.out / "runs", sample_path=sample,
                    log=lambda msg: print(msg, file=sys.stderr), regimes=args.regimes, axes=axes)
    verdicts = judge_table([r.measured for r in runs], unknowns)
    wall_s = time.monotonic() - began
    sheet = [be for be in spec_sheet(all_rows()) if be.flow in names]
    written = write_table(args.out, verdicts, runs, unknowns, command, wall_s=wall_s, spec=sheet)
    if args.json:
        print_json(table_json(verdicts, runs, unknowns, command, wall_s, sheet))
        return 0
    print_table(f"candidates ({unknowns_text(unknowns)})", ("candidate", "bottleneck", "operations", "budget",
                                                            "precision", "placement", "verdict"),
                [(v.row.name, *row_cells(v), v.verdict) for v in verdicts],
                caption=f"written: {written['markdown']}, {written['json']}, {written['evidence']}; {written['png']}; "
                        f"{wall_s / 60:.1f} min")
    for v, r in zip(verdicts, runs, strict=True):
        print(f"{v.row.name}: {v.verdict}: {v.why}")
        if r.regime is not None:
            print(f"    where: {r.regime.where}")
        for f in v.flips:
            print(f"    {f.describe()}")
    return 0
