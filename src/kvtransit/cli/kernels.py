"""`kvtransit kernels`: docs/reference.md §5's kernel table, plus any kernel you declare, judged by the budget check.

    kvtransit kernels --declare name=score,ops_per_byte=1,op_types=mac --module-budget low
    kvtransit kernels --declare examples/kernels/freq-keep-half.toml --module-budget 0.8

A declared kernel (a .toml/.json file, or inline key=value text) gets its checks printed below the table,
with the arithmetic: op set, transform ops, other ops, total charged against the budget (and the slowdown
when over), placement, precision.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from kvtransit.cli._common import add_json_flag, module_budget_arg, print_json, print_table


def register(subparsers) -> None:
    from kvtransit.model.module.budget import Policy

    p = subparsers.add_parser("kernels", help="what kernels cost on the module, and whether they fit",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--declare", action="append", default=[], metavar="FILE|SPEC",
                   help="a kernel file (.toml or .json, as examples/kernels/) or inline "
                        "name=...,ratio=...,ops_per_byte=...,op_types=fft+gather,transform=none|fft|dct|ntt,"
                        "transform_length=N,transform_charged=yes|no,precision_bits=B,placement=pluggable|switch,"
                        "lossless=yes|no,streams=S (repeatable)")
    p.add_argument("--module-budget", "--budget", dest="budget", type=module_budget_arg, default="sim",
                   metavar="low|sim|high|OPS",
                   help="module budget for the verdict: low 0.40, sim 1.6 (default), high 3.96 ops/B, "
                        "or a number of ops/B (--budget: the old spelling, for one release)")
    p.add_argument("--policy", choices=[x.value for x in Policy], default=Policy.REJECT.value,
                   help="a kernel needing an unpublished op is rejected (default) or runs on the host")
    add_json_flag(p)
    p.set_defaults(func=run)


def _yes_no(flag: bool) -> str:
    return "yes" if flag else "no"


def _declare(text: str) -> tuple[Any, str | None]:
    """(declaration, file it came from or None) for one --declare value."""
    from kvtransit.model.catalog.codecs import parse_kernel_declaration
    from kvtransit.model.module.kernel_file import is_kernel_file_name, load_kernel_declaration

    if is_kernel_file_name(text):
        return load_kernel_declaration(text), text
    return parse_kernel_declaration(text), None


def _checks(decl: Any, module: Any, policy: Any) -> dict[str, Any]:
    """Each check on one declaration, with the numbers its arithmetic uses (what --json gives)."""
    from kvtransit.model.module.budget import (
        BF16_BYTES,
        FFT_OPS_PER_VALUE_PER_LOG2N,
        PUBLISHED_OPS,
        budget_check,
        placement_check,
    )

    result = budget_check(decl, module, policy)
    placed = placement_check(decl)
    n = decl.transform_length
    return {
        "op_set": {
            "ops": sorted(decl.op_types),
            "published": sorted(decl.op_types & PUBLISHED_OPS),
            "unpublished": sorted(decl.unpublished_ops),
            "wiring": sorted(decl.wiring_ops),
            "in_set": decl.in_published_set,
        },
        "transform": {
            "kind": decl.transform,
            "length": n,
            "ops_per_value_per_log2n": FFT_OPS_PER_VALUE_PER_LOG2N,
            "bytes_per_value": BF16_BYTES,
            "log2_n": math.log2(n) if n is not None else None,
            "ops_per_byte": decl.transform_ops_per_byte,
            "charged": decl.transform_charged,
            "charged_ops_per_byte": decl.charged_transform_ops_per_byte,
        },
        "other_ops_per_byte": decl.ops_per_byte,
        "charged_ops_per_byte": decl.charged_ops_per_byte,
        "budget_ops_per_byte": module.ops_per_byte,
        "within_budget": decl.charged_ops_per_byte <= module.ops_per_byte,
        "slowdown": max(1.0, decl.charged_ops_per_byte / module.ops_per_byte),
        "placement": {
            "placement": placed.placement,
            "streams_needed": placed.streams_needed,
            "streams_seen": placed.streams_seen,  # null: many (a switch)
            "ok": placed.ok,
            "text": placed.describe(),
        },
        "precision_bits": decl.precision_bits,
        "lossless": decl.lossless,
        "ratio": decl.ratio,
        "verdict": result.verdict.value,
        "action": result.action.value,
        "verdict_text": result.describe(),
    }


def _check_lines(name: str, file: str | None, checks: dict[str, Any], budget_name: str) -> list[str]:
    """The checks of one declared kernel as text, each with its arithmetic."""
    from kvtransit.model.module.budget import MODULE_BUDGETS

    budget = checks["budget_ops_per_byte"]
    budget_label = f"{budget_name} {budget:.2f} ops/B" if budget_name in MODULE_BUDGETS else f"{budget:.2f} ops/B"
    ops, tr, placed = checks["op_set"], checks["transform"], checks["placement"]
    op_text = ", ".join(ops["ops"]) or "(none)"
    notes = []
    if ops["unpublished"]:
        notes.append(f"unpublished: {', '.join(ops['unpublished'])}")
    if ops["wiring"]:
        notes.append(f"{', '.join(ops['wiring'])}: wiring, 0 ops")
    in_set = "in the published set" if ops["in_set"] else "NOT in the published set"
    op_line = f"{op_text} -> {in_set}" + (f" ({'; '.join(notes)})" if notes else "")

    if tr["kind"] == "none":
        tr_line = "none -> 0.00 ops/B"
        if {"fft", "ntt"} & set(ops["ops"]):
            tr_line += " (fft/ntt listed but no transform declared: its cost is not counted)"
    else:
        n, log2n = tr["length"], tr["log2_n"]
        per_byte = tr["ops_per_value_per_log2n"] / tr["bytes_per_value"]
        cost = (f"{tr['kind']} N = {n}: {per_byte:g} × log2 {n} = {per_byte:g} × {log2n:g} "
                f"= {tr['ops_per_byte']:.2f} ops/B")
        tr_line = (f"{cost}, charged -> {tr['charged_ops_per_byte']:.2f}" if tr["charged"]
                   else f"{cost}, free (transform_charged = no) -> 0.00")

    charged = checks["charged_ops_per_byte"]
    total = (f"{tr['charged_ops_per_byte']:.2f} + {checks['other_ops_per_byte']:.2f} = {charged:.2f} ops/B "
             f"vs budget {budget_label} -> ")
    if checks["within_budget"]:
        total += "within"
    else:
        total += (f"over: transit-bound, link slowed x{checks['slowdown']:.2f} "
                  f"({charged:.2f} / {budget:.2f}: the module runs at 1/{checks['slowdown']:.2f} of line rate)")
    bits = checks["precision_bits"]
    return [
        f"Kernel {name!r}" + (f" ({file})" if file else " (inline)"),
        f"  op set:     {op_line}",
        f"  transform:  {tr_line}",
        f"  other ops:  {checks['other_ops_per_byte']:.2f} ops/B",
        f"  total:      {total}",
        f"  placement:  {placed['text']}",
        f"  precision:  {'not declared' if bits is None else f'{bits} bits (the analogue path)'}",
        f"  ratio:      {checks['ratio']:g} (input bytes / output bytes), lossless: {_yes_no(checks['lossless'])}",
        f"  verdict:    {checks['verdict_text']}",
    ]


def run(args: argparse.Namespace) -> int:
    from kvtransit.model.catalog.codecs import KERNEL_TABLE_ROWS, kernel_table_row
    from kvtransit.model.module.budget import Module, Policy, budget_check, budget_ops_per_byte

    declared = [_declare(text) for text in args.declare]
    ops_per_byte = budget_ops_per_byte(args.budget)
    module = Module(ops_per_byte=ops_per_byte)
    policy = Policy(args.policy)
    records: list[dict[str, Any]] = []
    rows = [("reference", d, None) for d in KERNEL_TABLE_ROWS] + [("declared", d, f) for d, f in declared]
    for source, decl, file in rows:
        row = kernel_table_row(decl)
        result = budget_check(decl, module, policy)
        record: dict[str, Any] = {
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
        }
        if source == "declared":
            record["file"] = file
            record["checks"] = _checks(decl, module, policy)
        records.append(record)
    if args.json:
        print_json({"budget": args.budget, "budget_ops_per_byte": module.ops_per_byte, "policy": policy.value,
                    "kernels": records})
        return 0
    print_table(
        "Kernels on the module (docs/reference.md §5)",
        ["Kernel", "Transform / byte", "Other / byte", "In set", "Fits high budget, transform charged",
         "Fits low budget, transform free", f"At budget {args.budget} ({module.ops_per_byte:.2f} ops/B)"],
        [
            [r["kernel"], f"{r['transform_ops_per_byte']:.2f}", f"{r['other_ops_per_byte']:.2f}", _yes_no(r["in_set"]),
             _yes_no(r["fits_high_transform_charged"]), _yes_no(r["fits_low_transform_free"]), r["verdict_text"]]
            for r in records
        ],
        caption="transform of a real FFT of length N on BF16 = 1.25·log2 N ops/byte; budgets 0.40 (low) to 3.96 (high)",
    )
    for r in records:
        if r["source"] == "declared":
            print()
            print("\n".join(_check_lines(r["kernel"], r["file"], r["checks"], args.budget)))
    return 0
