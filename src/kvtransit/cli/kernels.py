"""`kvtransit kernels`: REFERENCE §5's kernel table, plus any kernel you declare, judged by the budget check.

    kvtransit kernels --declare name=score,ops_per_byte=1,op_types=mac --budget low
"""

from __future__ import annotations

import argparse
from typing import Any

from ._common import add_json_flag, print_json, print_table


def register(subparsers) -> None:
    from kvtransit.model.module import MODULE_BUDGETS, Policy

    p = subparsers.add_parser("kernels", help="what kernels cost on the module, and whether they fit",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--declare", action="append", default=[], metavar="SPEC",
                   help="name=...,ratio=...,ops_per_byte=...,op_types=fft+mac,transform_charged=yes|no,"
                        "transform_length=N,precision_bits=B,placement=pluggable|switch (repeatable)")
    p.add_argument("--budget", choices=list(MODULE_BUDGETS), default="sim",
                   help="module budget for the verdict column: low 0.40, sim 1.6 (default), high 3.96 ops/B")
    p.add_argument("--policy", choices=[x.value for x in Policy], default=Policy.REJECT.value,
                   help="a kernel needing an unpublished op is rejected (default) or runs on the host")
    add_json_flag(p)
    p.set_defaults(func=run)


def _yes_no(flag: bool) -> str:
    return "yes" if flag else "no"


def run(args: argparse.Namespace) -> int:
    from kvtransit.model.codecs import KERNEL_TABLE_ROWS, kernel_table_row, parse_kernel_declaration
    from kvtransit.model.module import MODULE_BUDGETS, Module, Policy, budget_check

    declared = [parse_kernel_declaration(text) for text in args.declare]
    module = Module(ops_per_byte=MODULE_BUDGETS[args.budget])
    policy = Policy(args.policy)
    records: list[dict[str, Any]] = []
    for source, decl in [("reference", d) for d in KERNEL_TABLE_ROWS] + [("declared", d) for d in declared]:
        row = kernel_table_row(decl)
        result = budget_check(decl, module, policy)
        records.append({
            "kernel": row.name,
            "source": source,
            "transform_ops_per_byte": row.transform_ops_per_byte,
            "other_ops_per_byte": row.other_ops_per_byte,
            "in_set": row.in_set,
            "fits_high_transform_charged": row.fits_high_transform_charged,
            "fits_low_transform_free": row.fits_low_transform_free,
            "verdict": result.verdict.value,
            "action": result.action.value,
            "slowdown": result.slowdown,
            "verdict_text": result.describe(),
        })
    if args.json:
        print_json({"budget": args.budget, "budget_ops_per_byte": module.ops_per_byte, "policy": policy.value,
                    "kernels": records})
        return 0
    print_table(
        "Kernels on the module (REFERENCE §5)",
        ["Kernel", "Transform / byte", "Other / byte", "In set", "Fits high budget, transform charged",
         "Fits low budget, transform free", f"At budget {args.budget} ({module.ops_per_byte:.2f} ops/B)"],
        [
            [r["kernel"], f"{r['transform_ops_per_byte']:.2f}", f"{r['other_ops_per_byte']:.2f}", _yes_no(r["in_set"]),
             _yes_no(r["fits_high_transform_charged"]), _yes_no(r["fits_low_transform_free"]), r["verdict_text"]]
            for r in records
        ],
        caption="transform of a real FFT of length N on BF16 = 1.25·log2 N ops/byte; budgets 0.40 (low) to 3.96 (high)",
    )
    return 0
