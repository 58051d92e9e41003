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
catalogued link). Written: OUT/candidates.md, .json and .png (the plots extra), each row's run under OUT/runs/ and
the command reproducing it, and "what would flip each verdict": per unknown, the nearest change that changes it.
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
    return shlex.join(argv)


def run(args: argparse.Namespace) -> int:
    from kvtransit.harness.studies.candidates.report import row_cells, table_json, unknowns_text, write_table
    from kvtransit.harness.studies.candidates.rows import candidate_names
    from kvtransit.harness.studies.candidates.run import default_sample_path, run_rows
    from kvtransit.harness.studies.candidates.verdicts import judge_table

    names = candidate_names(args.only)  # every input checked before anything runs
    unknowns = unknowns_from_args(args)
    sample = args.sample or default_sample_path()
    if not sample.exists():
        raise CliError(f"no KV sample at {sample} (pass --sample PATH)")
    command = _command(args)
    runs = run_rows(names, unknowns, args.runs or args.out / "runs", sample_path=sample,
                    log=lambda msg: print(msg, file=sys.stderr))
    verdicts = judge_table([r.measured for r in runs], unknowns)
    written = write_table(args.out, verdicts, runs, unknowns, command)
    if args.json:
        print_json(table_json(verdicts, runs, unknowns, command))
        return 0
    print_table(f"candidates ({unknowns_text(unknowns)})", ("candidate", "bottleneck", "operations", "budget",
                                                            "precision", "placement", "verdict"),
                [(v.row.name, *row_cells(v), v.verdict) for v in verdicts],
                caption=f"written: {written['markdown']}, {written['json']}; {written['png']}")
    for v in verdicts:
        print(f"{v.row.name}: {v.verdict}: {v.why}")
        for f in v.flips:
            print(f"    {f.describe()}")
    return 0
