"""A real benchmark tool against the OpenAI front end: does it measure the TTFT and ITL the testbed measured?

    python benchmarks/frontend_tools.py [--tool aiperf|guidellm] [--requests 16] [--input-tokens 1024]
                                        [--output-tokens 32] [--concurrency 1] [--aiperf PATH] [--guidellm PATH]

One run of `kvtransit up --frontend` (the Launcher in-process, loopback, codec none) serves the tool, which runs as
its own process against the front end's URL: NVIDIA's AIPerf (`aiperf profile`, completions, streaming) or
GuideLLM (`guidellm run`, chat completions, streaming), each with synthetic prompts of --input-tokens and
--output-tokens outputs. The run is stopped once the tool is done; then the tool's own result file is read
beside the run report, for the same requests: the tool's TTFT and ITL (AIPerf's inter_token_latency and
GuideLLM's inter_token_latency_ms are both (latency − TTFT) / (output tokens − 1) per request, the report's
TPOT) against the report's (model seconds × the run's dilation: wall time, as the tool sees it). Prints mean,
median and p99 of each, the tool/testbed ratio, and the row for benchmarks/RESULTS.md.

What separates the two TTFTs is the client's side only: the front end keeps connections open (HTTP/1.1 keep-alive,
runtime/http.py), so a tool's pool reuses one and pays no TCP connect per request, and the testbed's TTFT starts
when a request's first byte reached the front end, so receiving its body, parsing and tokenizing it are in both.
What is left is the tool's own: building and sending the request, and reading the SSE event.

Offline: both tools need a Hugging Face tokenizer, and neither may reach the Hub here. The script exports
SmolLM2-135M's tokenizer (the realkv extra's GGUF, read by transformers) to a local folder and hands the tools
its path; the front end counts prompt tokens with the same tokenizer (--tokenizer smollm2), so the tool's
input lengths and the testbed's agree. The tools are not dependencies of kvtransit: install each in its own
virtualenv (`python -m venv V && V/bin/pip install aiperf` or `guidellm`) and pass its executable (the default
is the name on PATH). Do not set HF_HUB_OFFLINE for AIPerf 0.13: in offline mode it resolves every tokenizer
name as a Hub cache entry and refuses a local path; online mode takes a local path without a Hub call.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from kvtransit.agents.frontend.prompt_tokens import load_smollm2
from kvtransit.harness.up.agent_commands import FrontendOptions
from kvtransit.harness.up.launcher import Launcher
from kvtransit.model.judge.slo import percentile
from kvtransit.model.scenario import Scenario

TOOL_TIMEOUT_S = 900.0  # a tool that hangs must not hold the run forever


def export_tokenizer(folder: Path) -> Path:
    """SmolLM2's tokenizer, from the GGUF file, as a Hugging Face tokenizer folder the tools can load offline."""
    counter = load_smollm2()
    counter._tokenizer.save_pretrained(folder)  # the HF tokenizer the counter wraps
    return folder


def aiperf_argv(exe: str, url: str, model: str, tokenizer: Path, out: Path, args: argparse.Namespace) -> list[str]:
    return [exe, "profile", "--model", model, "--url", url.removesuffix("/v1"), "--endpoint-type", "completions",
            "--streaming", "--tokenizer", str(tokenizer), "--request-count", str(args.requests),
            "--concurrency", str(args.concurrency), "--synthetic-input-tokens-mean", str(args.input_tokens),
            "--synthetic-input-tokens-stddev", "0", "--output-tokens-mean", str(args.output_tokens),
            "--output-tokens-stddev", "0", "--extra-inputs", "ignore_eos:true", "--output-artifact-dir", str(out),
            "--ui-type", "none"]


def guidellm_argv(exe: str, url: str, model: str, tokenizer: Path, out: Path, args: argparse.Namespace) -> list[str]:
    profile = "kind=synchronous" if args.concurrency == 1 else f"kind=concurrent,streams={args.concurrency}"
    return [exe, "run", "--backend", f"kind=openai_http,target={url.removesuffix('/v1')},model={model}",
            "--profile", profile, "--constraint", f"kind=max_requests,count={args.requests}",
            "--tokenizer", f"kind=huggingface_auto,model={tokenizer}",
            "--data", f"kind=synthetic_text,prompt_tokens={args.input_tokens},output_tokens={args.output_tokens}",
            "--output", f"kind=json,path={out / 'guidellm.json'}", "--disable-console-interactive"]


def aiperf_figures(out: Path) -> dict[str, dict[str, float]]:
    """AIPerf's per-request TTFT and ITL (ms) from profile_export.jsonl, profiling phase only."""
    ttft, itl = [], []
    for line in (out / "profile_export.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("metadata", {}).get("benchmark_phase") not in (None, "profiling"):
            continue
        metrics = record.get("metrics", {})
        if "time_to_first_token" in metrics:
            ttft.append(metrics["time_to_first_token"]["value"])
        if "inter_token_latency" in metrics:
            itl.append(metrics["inter_token_latency"]["value"])
    return {"ttft_ms": summary(ttft), "itl_ms": summary(itl)}


def guidellm_figures(out: Path) -> dict[str, dict[str, float]]:
    """GuideLLM's successful requests' TTFT and per-request ITL (ms)."""
    benchmark = json.loads((out / "guidellm.json").read_text())["benchmarks"][0]
    ttft, itl = [], []
    for request in benchmark["requests"]["successful"]:
        if request.get("time_to_first_token_ms") is not None:
            ttft.append(request["time_to_first_token_ms"])
        if request.get("inter_token_latency_ms") is not None:
            itl.append(request["inter_token_latency_ms"])
    return {"ttft_ms": summary(ttft), "itl_ms": summary(itl)}


def report_figures(report: dict) -> dict[str, dict[str, float]]:
    """The testbed's per-request TTFT and TPOT of every completed request, as wall ms (× the run's dilation)."""
    dilation = report["config"]["effective_dilation"]
    done = [r for r in report["per_request"] if r["outcome"] in ("ok", "slo-miss")]
    return {"ttft_ms": summary([r["ttft_s"] * dilation * 1e3 for r in done]),
            "itl_ms": summary([r["tpot_s"] * dilation * 1e3 for r in done if r["tpot_s"] is not None])}


def summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0, "mean": float("nan"), "p50": float("nan"), "p99": float("nan")}
    return {"n": len(values), "mean": statistics.fmean(values), "p50": percentile(values, 50),
            "p99": percentile(values, 99)}


async def serve_and_measure(args: argparse.Namespace, workdir: Path, tokenizer: Path) -> tuple[dict, Path, list[str]]:
    scenario = Scenario(codec="none")
    launcher = Launcher(scenario, report_path=workdir / "run.json", accuracy_sample=0, drain_timeout_s=30.0,
                        log=lambda _line: None, frontend=FrontendOptions(listen="127.0.0.1:0", tokenizer="smollm2"))
    stop = asyncio.Event()
    run = asyncio.create_task(launcher.run(stop))
    while launcher.frontend_url is None:
        if run.done():
            await run  # a start-up failure: raise it here
        await asyncio.sleep(0.1)  # polling the launcher's state: no model time
    out = workdir / args.tool
    out.mkdir()
    exe = shutil.which(getattr(args, args.tool)) or getattr(args, args.tool)
    build = aiperf_argv if args.tool == "aiperf" else guidellm_argv
    argv = build(exe, launcher.frontend_url, scenario.model, tokenizer, out, args)
    tool = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT)
    async with asyncio.timeout(TOOL_TIMEOUT_S):
        output, _ = await tool.communicate()
    stop.set()
    path = await run
    if tool.returncode != 0:
        sys.exit(f"{args.tool} failed (exit {tool.returncode}):\n{output.decode(errors='replace')[-3000:]}")
    assert path is not None
    figures = aiperf_figures(out) if args.tool == "aiperf" else guidellm_figures(out)
    return figures, path, argv


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tool", choices=("aiperf", "guidellm"), default="aiperf")
    parser.add_argument("--aiperf", default="aiperf", help="the aiperf executable (default: on PATH)")
    parser.add_argument("--guidellm", default="guidellm", help="the guidellm executable (default: on PATH)")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--input-tokens", type=int, default=1024)
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvt-frontend-tools-") as tmp:
        workdir = Path(tmp)
        tokenizer = export_tokenizer(workdir / "tokenizer")
        tool, path, argv = asyncio.run(serve_and_measure(args, workdir, tokenizer))
        report = json.loads(path.read_text())
    testbed = report_figures(report)
    print(f"{args.tool}: {' '.join(argv[1:])}")
    print(f"requests: tool {tool['ttft_ms']['n']}, testbed {report['requests']['total']} "
          f"(ok {report['requests']['ok']}, slo-miss {report['requests']['slo_miss']}, "
          f"failed {report['requests']['failed']}); tokenizer {report['frontend']['tokenizer']}")
    print(f"{'figure':<10} {'stat':<5} {args.tool + ' ms':>12} {'testbed ms':>12} {'ratio':>7} {'diff ms':>8}")
    for figure in ("ttft_ms", "itl_ms"):
        for stat in ("mean", "p50", "p99"):
            ours, theirs = testbed[figure][stat], tool[figure][stat]
            print(f"{figure[:-3]:<10} {stat:<5} {theirs:>12.2f} {ours:>12.2f} {theirs / ours:>7.3f} "
                  f"{theirs - ours:>8.2f}")
    print(results_row(args, tool, testbed))


def results_row(args: argparse.Namespace, tool: dict, testbed: dict) -> str:
    """The run as a row of RESULTS.md's table (tool | prompt | TTFT mean, p50 | TTFT gap | ITL mean, p50)."""
    def pair(figure: str, stat: str, digits: int) -> str:
        theirs, ours = tool[figure][stat], testbed[figure][stat]
        return f"{theirs:.{digits}f} / {ours:.{digits}f} ms ({theirs / ours:.3f})"

    gap = tool["ttft_ms"]["mean"] - testbed["ttft_ms"]["mean"]
    return (f"| {args.tool} | {args.input_tokens:,} | {pair('ttft_ms', 'mean', 1)}, {pair('ttft_ms', 'p50', 1)} | "
            f"{gap:+.1f} ms | {pair('itl_ms', 'mean', 2)}, "
            f"{tool['itl_ms']['p50'] / testbed['itl_ms']['p50']:.3f} |")


if __name__ == "__main__":
    main()
