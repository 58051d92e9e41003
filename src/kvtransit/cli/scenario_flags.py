"""The scenario flags every serving command shares (`kvtransit up`, `prefill`, `decode`, `loadgen`, `middlebox`).

One argparse group built from `Scenario`'s own fields, so a flag cannot exist for one process and not for
another, and `Scenario.to_argv()` is always accepted by every one of them. Values are checked by `Scenario`
itself (one-line `ConfigError` naming the field and the valid choices), not by argparse, so the rules live
in one place.

`--kernel FILE` runs a declared kernel: the file's declaration (`model/module/kernel_file.py`) is mapped onto
the fields of the one implementation that runs it (`model/module/kernel_runs.py`), and those fields are set as if given
as flags; a flag given on the command line that says otherwise is an error naming both. The scenario then
records the file (`kernel_file`) and is canonical: the processes get `Scenario.to_argv()`, never the file.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from kvtransit.cli._common import module_budget_arg
from kvtransit.model.errors import ConfigError
from kvtransit.model.scenario import Scenario, flag_for, scenario_fields
from kvtransit.model.scenario_text import FieldTextError, field_from_text

# Where the parsed namespace lists the scenario fields whose flag was on the command line, so `--kernel` can tell
# a flag given (which it must not silently override) from one left at the field's default.
GIVEN = "given_scenario_fields"


class _StoreGiven(argparse.Action):
    """argparse's store, which also adds the field to the namespace's `GIVEN` set."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        setattr(namespace, GIVEN, getattr(namespace, GIVEN, frozenset()) | {self.dest.removeprefix("scenario_")})


_HELP = {
    "model": "model served (catalogue key)",
    "device": "GPU of every instance",
    "gpus": "GPUs per instance",
    "prefill": "prefill instances",
    "decode": "decode instances",
    "link": "hand-off link from prefill to decode",
    "channels": "parallel channels of the hand-off link",
    "handoff": "when the KV goes to the link: whole (after the prefill step, the reference model) or layerwise (each "
               "layer as its compute ends, overlapping the step)",
    "prefill_chunk": "chunked prefill: at most this many prompt tokens a step (512..8192: one KV block .. a step's "
                     "token budget), each chunk's KV released at its chunk's end; 0: off",
    "codec": "codec applied to the KV on the hand-off",
    "keep": "freq-keep-k: share of each block's coefficients kept",
    "sinks": "freq-keep-k: leading tokens kept exact",
    "block": "freq-keep-k: tokens per transform block; fp4-block: values per scale",
    "variant": "freq-keep-k transform",
    "compress_at": "where the codec runs: in transit (the module) or on the prefill GPU",
    "policy": "a kernel needing unpublished ops: reject it or run it on the host",
    "module_budget": "ops per line byte the module affords: low (0.40), sim (1.6), high (3.96) or a number > 0",
    "module_pj_per_bit": "the module's energy, pJ per input bit (docs/reference.md §5: 1)",
    "module_latency_us": "the module's added latency, µs (docs/reference.md §5: 1)",
    "transform_charged": "yes: the transform costs 1.25·log2 N ops/B of the budget; no: passive optics, free "
                         "(the flag alone means yes)",
    "precision_bits": "bits the analogue path delivers (1..32), or none (exact)",
    "placement": "where the module sits: pluggable (one stream) or switch (many streams)",
    "kernel_file": "the kernel file the codec fields were mapped from (set by --kernel; a record for the report, "
                   "not read)",
    "rate": "requests per second",
    "arrival": "arrival process",
    "burstiness": "gamma arrivals: shape (1 = Poisson-like, lower = burstier)",
    "requests": "requests in the run",
    "prompt_mean": "mean prompt length, tokens",
    "prompt_cv": "prompt length coefficient of variation",
    "output_mean": "mean output length, tokens",
    "output_cv": "output length coefficient of variation",
    "seed": "workload seed (same seed, same requests as the simulator)",
    "max_concurrency": "most requests in flight at once (0: unlimited, open loop)",
    "scale": "payload scale in (0, 1], or 'auto' (largest the host can carry)",
    "dilation": "time dilation >= 1: modelled durations stretched, link rates divided",
    "kv_sample": "KV content: synthetic, a real-KV sample (.npz) to seed it from, or real: the first "
                 "--real-kv-requests requests carry the real model's own KV over real text (the realkv extra)",
    "accuracy": "reconstruction: the codec's error on the sampled KV; model: decode feeds the KV that arrived into "
                "the real model and scores top-1 agreement and KL (needs --kv-sample real)",
    "real_kv_requests": "--kv-sample real: how many requests (the first ids) carry the real model's KV",
    "decode_tp": "each decode instance as a TP group of N GPUs: the decode and N - 1 follower rank processes, every "
                 "step's all-reduces real bytes over --scaleup-link (1: one process, no collectives)",
    "prefill_tp": "each prefill instance as a TP group of N GPUs likewise (its all-reduces carry every prompt token: "
                  "give a small --scale)",
    "trace": "replay this request trace (Mooncake .jsonl or Azure .csv) instead of drawing the workload",
    "trace_format": "trace format (auto: by file extension)",
    "trace_sample": "which of the trace's requests to replay: the first N (--requests) or N at random",
    "time_scale": "trace arrivals x this (0.1 replays ten times faster)",
    "context_cap": "trace prompts longer than this many tokens are cut to it",
    "trace_start": "replay the trace from its request K on (the requests before it are the window's past: "
                   "--pool-warm trace)",
    "ttft_slo_ms": "SLO: TTFT threshold, ms (docs/reference.md §4: 1000)",
    "tpot_slo_ms": "SLO: TPOT threshold, ms (docs/reference.md §4: 25)",
}


def _reader(field_name: str):
    """The flag's argparse type: the field's text read as `Scenario` reads it (model.scenario.field_from_text); a
    value of the wrong type is one line naming the flag (OneLineErrorParser: `argument --flag: ...`)."""

    def read(text: str):
        try:
            return field_from_text(field_name, text)
        except FieldTextError as exc:
            raise argparse.ArgumentTypeError(exc.reason) from None

    read.__name__ = field_name
    return read


_SAME = object()  # add_scenario_flag's default: the field's own


def add_scenario_flag(parser: argparse.ArgumentParser | Any, field_name: str, *, aliases: Sequence[str] = (),
                      default: Any = _SAME, help: str | None = None, choices: Sequence[Any] | None = None) -> None:
    """One `Scenario` field's flag on a side command that shares the knob (`kvtransit ring`, `select`,
    `collective`, `weights`, ...): spelled, read and explained as `kvtransit up` takes it, its value in
    `args.<field_name>`. `default`: the command's own, where it differs (said in the help); `aliases`: a spelling
    the command used before, accepted for one release (docs/flags.md lists them); `choices`: the values the command
    takes, where `Scenario` would check them only once the scenario is built."""
    field = next((f for f in scenario_fields() if f.name == field_name), None)
    if field is None:
        raise KeyError(f"no Scenario field {field_name!r}")
    value = field.default if default is _SAME else default
    shown = "none" if value is None else value
    text = f"{help or field.help or _HELP.get(field_name, field_name)} (default: {shown})"
    if aliases:
        text += f"; also {', '.join(aliases)}, the old spelling, for one release"
    names = [flag_for(field_name), *aliases]
    # No Scenario checks a side command's values: the budget is checked as it is read (a name or a number > 0).
    read = module_budget_arg if field_name == "module_budget" else _reader(field_name)
    if isinstance(field.default, bool):
        parser.add_argument(*names, dest=field_name, type=read, default=value, nargs="?", const=True,
                            metavar="yes|no", help=text)
    else:
        parser.add_argument(*names, dest=field_name, type=read, default=value, choices=choices,
                            metavar=field_name.upper() if choices is None else None, help=text)


def add_scenario_args(parser: argparse.ArgumentParser) -> None:
    """Add one flag per `Scenario` field, defaulting to the field's default."""
    group = parser.add_argument_group("scenario (the same flags for every process of a run)")
    for f in scenario_fields():  # the core's, then each flow's (its section's help)
        default = f.default
        flag, read = flag_for(f.name), _reader(f.name)
        help_text = f"{f.help or _HELP.get(f.name, f.name)} (default: {default})"
        if isinstance(default, bool):  # given alone (`--transform-charged`: yes) or with its value (yes|no)
            group.add_argument(flag, dest=f"scenario_{f.name}", type=read, default=default, nargs="?", const=True,
                               action=_StoreGiven, metavar="yes|no", help=help_text)
        else:
            group.add_argument(flag, dest=f"scenario_{f.name}", type=read, default=default, action=_StoreGiven,
                               metavar=f.name.upper(), help=help_text)
    parser.set_defaults(**{GIVEN: frozenset()})
    group.add_argument("--kernel", dest="kernel_declaration_file", default=None, metavar="FILE",
                       help="run the kernel declared in FILE (.toml or .json, as `kvtransit kernels --declare` "
                            "checks it): sets --codec and its fields, --compress-at transit, --transform-charged, "
                            "--precision-bits and --placement (a flag given that says otherwise is an error)")
    group.add_argument("--goodput", dest="goodput_slo", nargs="+", default=None, metavar="KEY:MS",
                       help="vllm-bench-serve style SLO: ttft:MS and/or tpot:MS (sets --ttft-slo-ms/--tpot-slo-ms)")


# `--goodput` keys (vllm bench serve's names) → the Scenario field each sets.
_GOODPUT_KEYS = {"ttft": "ttft_slo_ms", "tpot": "tpot_slo_ms"}


def parse_goodput(items: list[str]) -> dict[str, float]:
    """`["ttft:500", "tpot:30"]` → `{"ttft_slo_ms": 500.0, "tpot_slo_ms": 30.0}` (ConfigError naming the bad item)."""
    out: dict[str, float] = {}
    for item in items:
        key, sep, value = item.partition(":")
        if not sep or key not in _GOODPUT_KEYS:
            raise ConfigError(f"--goodput: expected KEY:MS with KEY one of {', '.join(_GOODPUT_KEYS)}, got {item!r}")
        try:
            out[_GOODPUT_KEYS[key]] = float(value)
        except ValueError:
            raise ConfigError(f"--goodput: {key} needs a number of milliseconds, got {value!r}") from None
    return out


def kernel_file_fields(path: str, given: dict[str, Any]) -> dict[str, Any]:
    """The scenario fields `--kernel path` sets (the mapped implementation's, plus `kernel_file`), checked against
    the flags `given` on the command line: one that says otherwise is a ConfigError naming both."""
    from kvtransit.model.module.kernel_file import load_kernel_declaration
    from kvtransit.model.module.kernel_runs import scenario_fields_for

    declaration = load_kernel_declaration(path)  # its errors already start with the path
    try:
        mapped = scenario_fields_for(declaration)
    except ConfigError as exc:
        raise ConfigError(f"--kernel {path}: {exc}") from None
    mapped["kernel_file"] = path
    for name, value in mapped.items():
        if name in given and given[name] != value:
            flag = flag_for(name)
            raise ConfigError(f"--kernel {path} sets {flag} {_shown(value)}, but {flag} {_shown(given[name])} was "
                              f"given too: drop one")
    return mapped


def _shown(value: object) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    return "none" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def scenario_from_args(args: argparse.Namespace) -> Scenario:
    """The `Scenario` the parsed flags describe (raises ConfigError on a bad value, or a `--kernel` conflict)."""
    values = {f.name: getattr(args, f"scenario_{f.name}") for f in scenario_fields()}
    if getattr(args, "goodput_slo", None):
        values.update(parse_goodput(args.goodput_slo))
    kernel_path = getattr(args, "kernel_declaration_file", None)
    if kernel_path:
        given = {name: values[name] for name in getattr(args, GIVEN, frozenset())}
        values.update(kernel_file_fields(kernel_path, given))
    return Scenario.build(**values)
