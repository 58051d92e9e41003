"""Band-keep throughput: forward (encode) and inverse (decode) GB/s of *input* bytes, one core.

Each configuration is printed beside bare scipy.fft.rfft on the same array (float32, the same
[..., nblocks, N, D] view, axis -2, workers=1) and np.copyto (memcpy) measured in the same run, as
ratios, so the figures travel between machines. Median of --repeats runs.

    python benchmarks/kernels.py                 # the table recorded in benchmarks/RESULTS.md
    python benchmarks/kernels.py --quick         # fewer configurations
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import ml_dtypes
import numpy as np
import scipy.fft

from kvtransit.kernels import get_codec
from kvtransit.kernels.fft_backends import available_backends

DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def _median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up: plans, caches, page faults
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sinks", type=int, default=4)
    ap.add_argument("--keep", type=float, default=0.5)
    args = ap.parse_args()

    # One request's KV for 4 layers of a Llama-3-8B-like model: [layers, 2, kv_heads, tokens, head_dim].
    layers, kv_heads, head_dim, body_tokens = 4, 8, 128, 1024
    shape = (layers, 2, kv_heads, args.sinks + body_tokens, head_dim)
    rng = np.random.default_rng(0)
    base = rng.standard_normal(shape).astype(np.float32)
    blocks = (8, 64, 1024) if not args.quick else (64,)
    dtypes = ("float32", "bfloat16", "float16") if not args.quick else ("float32", "bfloat16")
    backends = available_backends()
    print(f"# shape {shape}, keep {args.keep}, sinks {args.sinks}, workers=1, median of {args.repeats}; "
          f"cpu count {os.cpu_count()}")

    memcpy_dst = np.empty_like(base)
    memcpy_s = _median_seconds(lambda: np.copyto(memcpy_dst, base), args.repeats)
    print(f"memcpy float32: {base.nbytes / memcpy_s / 1e9:.2f} GB/s")
    header = ("block", "dtype", "variant", "backend", "fwd GB/s", "inv GB/s", "rfft GB/s", "fwd/rfft", "fwd/memcpy")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for n in blocks:
        body = base[..., args.sinks :, :]
        view = body.reshape((*body.shape[:-2], body_tokens // n, n, head_dim))
        contiguous = np.ascontiguousarray(view)
        rfft_s = _median_seconds(lambda c=contiguous: scipy.fft.rfft(c, axis=-2, workers=1), args.repeats)
        rfft_gbs = contiguous.nbytes / rfft_s / 1e9
        for dname in dtypes:
            kv = base.astype(DTYPES[dname])
            for variant in ("fft", "dct"):
                for backend in backends:
                    codec = get_codec("freq-keep-k", keep=args.keep, block=n, sinks=args.sinks, variant=variant,
                                      backend=backend)
                    enc = codec.encode(kv)
                    fwd_s = _median_seconds(lambda c=codec, x=kv: c.encode(x), args.repeats)
                    inv_s = _median_seconds(lambda c=codec, e=enc: c.decode(e.header, e.payload), args.repeats)
                    fwd = kv.nbytes / fwd_s / 1e9
                    inv = kv.nbytes / inv_s / 1e9
                    # Ratios on the time per value, so a bfloat16 row compares like with like against float32 rFFT.
                    fwd_vs_rfft = rfft_s / fwd_s * (contiguous.size / kv.size)
                    fwd_vs_memcpy = memcpy_s / fwd_s * (base.size / kv.size)
                    print(f"| {n} | {dname} | {variant} | {backend} | {fwd:.2f} | {inv:.2f} | {rfft_gbs:.2f} | "
                          f"{fwd_vs_rfft:.2f} | {fwd_vs_memcpy:.3f} |", flush=True)


if __name__ == "__main__":
    main()
