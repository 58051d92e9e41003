"""Band-keep on small chunks: per-call time of the middlebox's encode and of decode's inverse, before vs after.

The chunks are the ones the testbed sends: llama3-8b's KV at the run's scale (model/kv_scale.py: scale cuts
channels, never tokens), one layer of a `--tokens` prompt made by kernels/synthetic_kv.py, cut into rows as the
prefill frames it (agents/common/kv_frames.py), and read back from the frame's bytes as the kernel stage does
(agents/middlebox/stages/kernel.py: `np.frombuffer(payload, BF16).reshape(shape)`, then `codec.encode`, the codec
object `activate` builds for `--kernel freq-keep-k`'s defaults). Decode is `kernels.registry.decode(header,
payload bytes)`, the call the decode agent makes (kernels/chunk_rows.py).

"Before" is the band-keep module and codec registry of git revision `--before` (default 447f4de, the last one
without the small-array plans), loaded from `git show` into modules of their own beside the current ones, so
both run in one process, interleaved call batch by call batch on the same arrays; every output is checked
byte-identical first. Reported: the median over `--repeats` batches of the per-call time, MB/s of raw BF16
input bytes, and before/after ratios.

    python benchmarks/bandkeep_small_chunks.py                  # 1/1024 (8 KB), 1/256 (32 KB), 1/32 (256 KB)
    python benchmarks/bandkeep_small_chunks.py --scales 1/1024 --tokens 2047 --repeats 15
    python benchmarks/bandkeep_small_chunks.py --profile after  # cProfile of the 8 KB encode loop
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from fractions import Fraction
from functools import partial
from pathlib import Path
from types import ModuleType

import numpy as np

from kvtransit.agents.common import kv_frames
from kvtransit.agents.middlebox.stages.kernel import NUMPY_DTYPES, KernelConfig, activate
from kvtransit.kernels import registry
from kvtransit.kernels.synthetic_kv import SyntheticKv
from kvtransit.model.module.budget import Module, Policy
from kvtransit.model.scenario import Scenario

REPO = Path(__file__).resolve().parent.parent
DEFAULT_BEFORE = "447f4de"


def _module_from_git(rev: str, path: str, name: str, workdir: Path,
                     replace: tuple[str, str] | None = None) -> ModuleType:
    """`path` at `rev` as module `name` (in kvtransit.kernels, so its relative imports resolve there)."""
    text = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:{path}"], check=True, capture_output=True,
                          text=True).stdout
    if replace is not None:
        if replace[0] not in text:
            raise SystemExit(f"{path} at {rev}: no line {replace[0]!r} to point at the old band-keep")
        text = text.replace(replace[0], replace[1])
    source = workdir / f"{name.rsplit('.', 1)[-1]}.py"
    source.write_text(text)
    spec = importlib.util.spec_from_file_location(name, source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class body runs
    spec.loader.exec_module(module)
    return module


def load_before(rev: str, workdir: Path) -> ModuleType:
    """The codec registry of `rev`, running on the band-keep module of `rev`."""
    _module_from_git(rev, "src/kvtransit/kernels/bandkeep.py", "kvtransit.kernels._before_bandkeep", workdir)
    return _module_from_git(rev, "src/kvtransit/kernels/registry.py", "kvtransit.kernels._before_registry", workdir,
                            ("from . import bandkeep,", "from . import _before_bandkeep as bandkeep,"))


def stage_chunk(scale: Fraction, tokens: int, model: str, link: str) -> np.ndarray:
    """The first chunk of layer 0 of a `tokens` prompt at `scale`, as the kernel stage reads it from the frame."""
    layout = Scenario(model=model, link=link, scale=float(scale), codec="freq-keep-k").kv_layout
    kv = SyntheticKv(layout.layers, layout.kv_heads, layout.head_dim, seed=0)
    rows = kv_frames.as_rows(kv.layer(request_id=1, layer=0, tokens=tokens))
    row_bytes = tokens * layout.head_dim * layout.bytes_per_value
    piece = kv_frames.row_slices(layout.layers, 2 * layout.kv_heads, row_bytes)[0]
    chunk = kv_frames.raw_chunk(1, 0, piece, rows)
    return np.frombuffer(bytes(chunk.payload), dtype=NUMPY_DTYPES[chunk.dtype]).reshape(chunk.shape)


def per_call_seconds(fns: dict[str, Callable[[], object]], calls: int, repeats: int) -> dict[str, float]:
    """Median over `repeats` batches of `calls` calls of each fn's mean per-call time; the fns take turns per
    batch, so a noisy neighbour slows both alike."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        for _ in range(max(10, calls // 10)):  # warm-up: plans, caches, scratch buffers
            fn()
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            times[name].append((time.perf_counter() - start) / calls)
    return {name: statistics.median(ts) for name, ts in times.items()}


def _fraction(text: str) -> Fraction:
    return Fraction(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", default=DEFAULT_BEFORE, help="git revision of the old band-keep (default %(default)s)")
    ap.add_argument("--scales", default="1/1024,1/256,1/32", help="comma-separated run scales")
    ap.add_argument("--tokens", type=int, default=2048, help="prompt tokens (the deck's mean)")
    ap.add_argument("--model", default="llama3-8b")
    ap.add_argument("--link", default="nvlink4")
    ap.add_argument("--calls", type=int, default=0, help="calls per batch (default: ~20 ms of work a batch)")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--profile", choices=("before", "after"), help="cProfile the first scale's encode loop instead")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="bandkeep-before-") as workdir:  # (loaded modules outlive it)
        old = load_before(args.before, Path(workdir))
    config = KernelConfig(codec="freq-keep-k")
    new_codec = activate(config, Module(), Policy.HOST).codec
    assert new_codec is not None
    old_codec = old.get_codec("freq-keep-k", keep=config.keep, block=config.block, sinks=config.sinks,
                              variant=config.variant, precision_bits=config.precision_bits)
    scales = [_fraction(s) for s in args.scales.split(",")]

    if args.profile:
        raw = stage_chunk(scales[0], args.tokens, args.model, args.link)
        codec = old_codec if args.profile == "before" else new_codec
        for _ in range(200):
            codec.encode(raw)
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(5000):
            codec.encode(raw)
        profile.disable()
        print(f"encode of {raw.shape} {raw.dtype} ({raw.nbytes} B), 5000 calls, {args.profile}:")
        pstats.Stats(profile).sort_stats("tottime").print_stats(16)
        return

    print(f"band-keep (keep {config.keep}, block {config.block}, sinks {config.sinks}, {config.variant}, backend "
          f"{new_codec.params['backend']}), {args.model} one layer of {args.tokens} tokens; before = {args.before}; "
          f"median of {args.repeats} batches")
    print("| scale | chunk shape | KB | encode µs before | after | ×faster | MB/s before | after "
          "| decode µs before | after | ×faster | MB/s before | after |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for scale in scales:
        raw = stage_chunk(scale, args.tokens, args.model, args.link)
        enc_old, enc_new = old_codec.encode(raw), new_codec.encode(raw)
        header, payload = enc_new.header, enc_new.payload.tobytes()
        if enc_old.header != header or enc_old.payload.tobytes() != payload:
            raise SystemExit(f"encode of {raw.shape} differs before/after")
        if old.decode(header, payload).tobytes() != registry.decode(header, payload).tobytes():
            raise SystemExit(f"decode of {raw.shape} differs before/after")
        calls = args.calls or max(20, int(0.02 / max(1e-6, raw.nbytes / 2e8)))
        enc = per_call_seconds({"before": partial(old_codec.encode, raw), "after": partial(new_codec.encode, raw)},
                               calls, args.repeats)
        dec = per_call_seconds({"before": partial(old.decode, header, payload),
                                "after": partial(registry.decode, header, payload)}, calls, args.repeats)
        mb = raw.nbytes / 1e6
        cells = [str(scale), "×".join(map(str, raw.shape)), f"{raw.nbytes / 1024:.1f}"]
        for t in (enc, dec):
            cells += [f"{t['before'] * 1e6:.1f}", f"{t['after'] * 1e6:.1f}", f"{t['before'] / t['after']:.2f}",
                      f"{mb / t['before']:.0f}", f"{mb / t['after']:.0f}"]
        print("| " + " | ".join(cells) + " |", flush=True)
    print("(outputs byte-identical before/after for every row: checked before timing)")


if __name__ == "__main__":
    main()
