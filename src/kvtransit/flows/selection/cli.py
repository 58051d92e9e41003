"""`kvtransit select`: query-aware KV selection live, a remote context's pages scored in transit and fetched by budget.

    kvtransit select --remote-context 32768 --link eth-100g --select-budget 1/16
    kvtransit select --select-summary minmax --policy host --select-budget 1/8 --sink-pages 1
    kvtransit select --select all

The flags it shares with `kvtransit up` are spelled as there (docs/flags.md).

Three processes over a shaped link (flows/selection/roles.py): a pool holding the context's KV, the module at decode's
end of the link, and decode. With `--select top-k` (the default) each decode step sends its query to the module,
which scores the pages' key summaries as they arrive from the pool (the mean key: one dot product, 1.00 op/B of
MAC, checked against the module's budget; Quest's min/max bound needs a max, so only `--policy host` runs it, at
decode), decode ranks the scores and fetches the chosen pages through the same link, then holds its step's compute
at the context it attends to. `--select all` fetches every token instead; by default it runs too, as the baseline,
so the table shows the step's TPOT effect. The context is the real-KV sample's (SmolLM2-135M, 353-384 tokens a
step, tests/data/smollm2_kv_sample.npz) standing for --remote-context tokens of --model: the scale is their bytes'
ratio, printed, and the model is shown at the bytes each step actually moved. The recall and attention-output error are
measured on what arrived, next to the same selection measured offline.
"""

from __future__ import annotations

import argparse
import math

from kvtransit.cli._common import CliError, add_json_flag, number_or_auto, print_json, print_table

MS = 1e3


def register(subparsers) -> None:
    from kvtransit.cli._model_args import add_model_flags
    from kvtransit.cli.scenario_flags import add_scenario_flag
    from kvtransit.model.catalog.devices import DEVICES

    p = subparsers.add_parser("select", help="query-aware KV selection: pages scored in transit, fetched by budget",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_flags(p, default="llama3-8b")
    add_scenario_flag(p, "device", aliases=("--gpu",), choices=sorted(DEVICES))
    add_scenario_flag(p, "remote_context", aliases=("--context",), help="remote context tokens")
    add_scenario_flag(p, "link", default="eth-100g", help="the link to the KV pool")
    add_scenario_flag(p, "select", default="top-k", choices=("top-k", "all"),
                      help="fetch the top pages by score, or every token")
    add_scenario_flag(p, "select_budget", aliases=("--budget",), help="fraction of the pages fetched (1/16 or 0.0625)")
    add_scenario_flag(p, "select_summary", aliases=("--summary",), choices=("mean", "minmax"),
                      help="a page's summary: its mean key (MAC) or Quest's min/max (needs a max: host)")
    add_scenario_flag(p, "page_size", help="tokens a page (Quest's 16)")
    add_scenario_flag(p, "precision_bits", aliases=("--score-bits",),
                      help="the scores' precision: bits the analogue path delivers (1..32), or none (exact)")
    p.add_argument("--sink-pages", type=int, default=0, help="first pages always fetched (default 0)")
    add_scenario_flag(p, "module_budget")
    add_scenario_flag(p, "policy", choices=("reject", "host"),
                      help="a scoring kernel the module cannot run (min/max needs a max): refuse it, or score at "
                           "decode")
    p.add_argument("--steps", type=int, default=8, help="decode steps (default 8; the first warms up)")
    p.add_argument("--dilation", type=number_or_auto, default="auto",
                   help="stretch every modelled duration (default auto: what this host can carry)")
    p.add_argument("--no-baseline", action="store_true", help="with --select top-k, do not also run --select all")
    p.add_argument("--sample", default=None, help="the real-KV sample (default tests/data/smollm2_kv_sample.npz)")
    p.add_argument("--text", default="prose", help="which of the sample's texts (default prose)")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import asyncio

    from kvtransit.cli._model_args import model_from_args
    from kvtransit.cli.accuracy import default_sample_path
    from kvtransit.flows.selection.run import offline_selection, plan_selection, run_selection
    from kvtransit.model.catalog.devices import device_by_name
    from kvtransit.model.catalog.links import link_by_name
    from kvtransit.model.field_checks import module_budget
    from kvtransit.model.module.budget import Module, Policy, budget_ops_per_byte

    if args.select == "all" and args.no_baseline:
        raise CliError("--no-baseline goes with --select top-k (--select all is the baseline)")
    module = Module(ops_per_byte=budget_ops_per_byte(module_budget(args.module_budget)))
    common = dict(context=args.remote_context, sample=args.sample or str(default_sample_path()), text=args.text,
                  kind=args.select_summary, page_size=args.page_size, precision_bits=args.precision_bits,
                  sink_pages=args.sink_pages, module=module, policy=Policy(args.policy), steps=args.steps,
                  dilation=args.dilation)
    model, device, link = model_from_args(args), device_by_name(args.device), link_by_name(args.link)
    budgets = [None] if args.select == "all" else [args.select_budget] + ([] if args.no_baseline else [None])
    plans = [plan_selection(model, device, link, budget=b, **common) for b in budgets]  # all refused up front
    summaries = []
    for plan in plans:
        report = asyncio.run(run_selection(plan))
        report.offline = offline_selection(plan)
        summaries.append(report.summary())
    ok = all(s["ok"] for s in summaries)
    if args.json:
        print_json({"runs": summaries, "tpot_effect": _effect(summaries)})
        return 0 if ok else 1
    print_report(summaries)
    return 0 if ok else 1


def _effect(summaries: list[dict]) -> dict | None:
    """With a top-k run and its all-tokens baseline: what selection does to the step (TPOT) and the bytes."""
    top = next((s for s in summaries if s["select"] == "top-k"), None)
    base = next((s for s in summaries if s["select"] == "all"), None)
    if top is None or base is None or not (top["ok"] and base["ok"]):
        return None
    return {"measured_step_ratio": base["measured_step_s"] / top["measured_step_s"],
            "model_step_ratio": base["model_step_s"] / top["model_step_s"],
            "measured_byte_ratio": (base["measured_page_bytes"]
                                    / (top["measured_page_bytes"] + top["measured_summary_bytes"])),
            "model_byte_ratio": base["model_fetched_bytes"] / top["model_fetched_bytes"]}


def _ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value * MS:,.2f}"


def _mb(value: float) -> str:
    return "-" if math.isnan(value) else f"{value / 1e6:,.1f}"


def print_report(summaries: list[dict]) -> None:
    first = summaries[0]
    rows = []
    for s in summaries:
        label = ("all tokens" if s["select"] == "all"
                 else f"top {s['budget']:.4g} of pages ({s['kind']}, {s['scoring']})")
        measured_bytes = s["measured_page_bytes"] + (0 if s["select"] == "all" else s["measured_summary_bytes"])
        rows.append([label, _mb(s["model_fetched_bytes"]), _mb(measured_bytes), _ms(s["model_step_s"]),
                     _ms(s["model_step_at_measured_bytes_s"]), _ms(s["measured_step_s"]),
                     "-" if math.isnan(s["step_error"]) else f"{s['step_error']:+.1%}"])
    dilations = ", ".join(sorted({f"{s['dilation']:g}" for s in summaries}))
    print_table(
        f"query-aware selection: {first['model']} on {first['device']}, {first['context']:,}-token remote context "
        f"over {first['link']}",
        ["", "MB a step (model)", "MB a step (moved)", "step ms (model)", "step ms (model, moved bytes)",
         "step ms (measured)", "measured − model"], rows,
        caption=(f"a step = fetch + the decode step's compute at the context attended (TPOT); bytes at full size; "
                 f"scale {first['scale']:.4g} ({first['kv']}), dilation {dilations} ({first['dilation_why']})"))
    for s in summaries:
        print(f"{'every token' if s['select'] == 'all' else 'top-k'}: faithful: {s['faithful_line']}")
        if s["budget_check"]:
            where = "in transit" if s["scoring"] == "transit" else "at the decode host"
            print(f"scoring ({s['kind']}): {s['budget_check']}; scored {where}")
        acc, off = s["accuracy"], s["offline"]
        if acc and s["select"] == "top-k":
            line = f"accuracy: recall {acc['recall']:.3f}, attention-output error {acc['output_error']:.3f} live"
            if off:
                line += f" (offline on the same queries: {off['recall']:.3f}, {off['output_error']:.3f})"
            print(line)
        for failure in s["failures"]:
            print(f"FAILED: {failure}")
    effect = _effect(summaries)
    if effect:
        print(f"selection: {effect['measured_byte_ratio']:.2f}x fewer bytes a step moved (model "
              f"{effect['model_byte_ratio']:.2f}x), the step {effect['measured_step_ratio']:.2f}x shorter measured "
              f"(model {effect['model_step_ratio']:.2f}x)")
