"""Kernel throughput, one core, each beside the bare numpy/scipy primitive measured in the same run, as ratios,
so the figures travel between machines. Median of --repeats runs.

Band-keep: forward (encode) and inverse (decode) GB/s of *input* bytes, beside bare scipy.fft.rfft on the
same array (float32, the same [..., nblocks, N, D] view, axis -2, workers=1) and np.copyto (memcpy).

ML-KEM NTT (kernels/ntt.py): ntt and multiply on a batch of degree-256 polynomials, GB/s of input as FIPS 203
encodes it (384 B per polynomial, 12 bits per coefficient), beside what numpy has for the same job: an
rFFT of the same rows (float64) for the transform; for the product, the floating-point FFT product (rFFT of
both, zero-padded to 512, multiply, irFFT, fold X^256 = -1, round, mod q: exact here, the largest sum is
256·q² < 2^32), one bare modular-multiply pass (a·b mod q, int64) and the np.convolve schoolbook.

All-reduce sum (kernels/stream_sum.py): N BF16 streams summed, GB/s of input BF16 bytes across all streams,
beside bare np.add of float32 arrays with the same number of values (N − 1 adds into an accumulator);
the ratio is on time per value.

KIVI-style requantisers (kernels/kivi.py): kivi-2 and kivi-3 encode and decode, GB/s of input BF16 bytes, on one
layer's chunk [2·kv_heads, tokens, head_dim], beside the bare numpy pass a group quantiser cannot do without: the
BF16 → float32 widening, min and max over groups of 32 tokens per channel, and rint((x − min)·(1/step)) (float32,
no float16 parameters, no packing);
the ratio is on time per value.

    python benchmarks/kernels.py                 # every table (band-keep's is the one in benchmarks/RESULTS.md)
    python benchmarks/kernels.py --quick         # fewer configurations
    python benchmarks/kernels.py --only ntt,sum  # just these kernels (bandkeep, ntt, sum, kivi)
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import ml_dtypes
import numpy as np
import scipy.fft

from kvtransit.kernels import get_codec, ntt, stream_sum
from kvtransit.kernels.fft_backends import available_backends

DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
KERNELS = ("bandkeep", "ntt", "sum", "kivi")


def _median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up: plans, caches, page faults
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _kernel_list(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in KERNELS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"--only takes a comma-separated list of: {', '.join(KERNELS)}")
    return names


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sinks", type=int, default=4)
    ap.add_argument("--keep", type=float, default=0.5)
    ap.add_argument("--only", type=_kernel_list, default=KERNELS, help=f"comma-separated, of: {', '.join(KERNELS)}")
    args = ap.parse_args()
    if "bandkeep" in args.only:
        bench_bandkeep(args)
    if "ntt" in args.only:
        bench_ntt(args)
    if "sum" in args.only:
        bench_stream_sum(args)
    if "kivi" in args.only:
        bench_kivi(args)


def bench_bandkeep(args: argparse.Namespace) -> None:
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


def _fft_negacyclic_multiply(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a·b mod (X^256 + 1, q) with numpy's floating-point FFT: the bare-numpy way to the same product."""
    n = ntt.N
    full = np.fft.irfft(np.fft.rfft(a, 2 * n) * np.fft.rfft(b, 2 * n), 2 * n)
    folded = np.rint(full[..., :n] - full[..., n:]).astype(np.int64)
    return folded % ntt.Q


def _convolve_schoolbook(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    n = ntt.N
    out = np.empty_like(a)
    for i in range(a.shape[0]):
        full = np.convolve(a[i], b[i])  # length 2n − 1
        out[i, : n - 1] = full[: n - 1] - full[n:]
        out[i, n - 1] = full[n - 1]
    return out % ntt.Q


def bench_ntt(args: argparse.Namespace) -> None:
    # A batch of polynomials: ML-KEM-768 works on vectors of 3 and a 3×3 matrix of them, so a batch stands for
    # many ciphertexts' worth of products at once.
    batch = 256 if args.quick else 1024
    rng = np.random.default_rng(0)
    a = rng.integers(0, ntt.Q, (batch, ntt.N))
    b = rng.integers(0, ntt.Q, (batch, ntt.N))
    assert (ntt.multiply(a, b) == _fft_negacyclic_multiply(a, b)).all()
    school_batch = 64  # np.convolve is one call per polynomial: time a slice, scale per polynomial
    assert (_convolve_schoolbook(a[:school_batch], b[:school_batch]) == ntt.multiply(a[:school_batch],
                                                                                  b[:school_batch])).all()
    poly_bytes = ntt.ENCODED_POLY_BYTES
    af = a.astype(np.float64)
    ntt_s = _median_seconds(lambda: ntt.ntt(a), args.repeats)
    rfft_s = _median_seconds(lambda: np.fft.rfft(af, axis=-1), args.repeats)
    mul_s = _median_seconds(lambda: ntt.multiply(a, b), args.repeats)
    fftmul_s = _median_seconds(lambda: _fft_negacyclic_multiply(a, b), args.repeats)
    modmul_s = _median_seconds(lambda: (a * b) % ntt.Q, args.repeats)
    school_s = _median_seconds(lambda: _convolve_schoolbook(a[:school_batch], b[:school_batch]),
                               max(1, args.repeats // 2)) * batch / school_batch
    print(f"\n# ML-KEM NTT (FIPS 203): {batch} polynomials of degree 256 mod {ntt.Q}, int64, one core, "
          f"median of {args.repeats}; GB/s of FIPS 203-encoded input ({poly_bytes} B per polynomial); "
          f"x bare = bare time / kernel time")
    header = ("op", "kernel GB/s", "bare primitive", "bare GB/s", "x bare")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    rows = (
        ("ntt (Alg. 9)", batch * poly_bytes, ntt_s, "np.fft.rfft float64, same rows", rfft_s),
        ("multiply (Alg. 9-12)", 2 * batch * poly_bytes, mul_s, "float FFT product (3 FFTs)", fftmul_s),
        ("multiply (Alg. 9-12)", 2 * batch * poly_bytes, mul_s, "(a*b) % q, one int64 pass", modmul_s),
        ("multiply (Alg. 9-12)", 2 * batch * poly_bytes, mul_s, "np.convolve schoolbook", school_s),
    )
    for op, nbytes, kernel_s, bare_name, bare_s in rows:
        print(f"| {op} | {nbytes / kernel_s / 1e9:.3f} | {bare_name} | {nbytes / bare_s / 1e9:.3f} | "
              f"{bare_s / kernel_s:.3f} |", flush=True)
    print(f"({ntt.MULTIPLY_OP_COUNTS.total} modular ops per multiply = "
          f"{ntt.MULTIPLY_OP_COUNTS.ops_per_input_byte():.1f} op/B: "
          f"{ntt.MULTIPLY_OP_COUNTS.total * batch / mul_s / 1e9:.2f} G modular ops/s here)")


def bench_stream_sum(args: argparse.Namespace) -> None:
    # Activations of one all-reduce: tokens × d_model (Llama-3-8B's d_model 4096) in BF16 per rank (docs/reference.md
    # §7).
    tokens, d_model = (256, 4096) if args.quick else (1024, 4096)
    counts = (2,) if args.quick else (2, 4, 8)
    rng = np.random.default_rng(0)
    print(f"\n# all-reduce sum: [{tokens}, {d_model}] BF16 per stream, one core, median of {args.repeats}; "
          f"GB/s of input bytes across all streams; ratio = bare time / kernel time, per value")
    header = ("streams", "sum GB/s", "bare np.add f32 GB/s", "sum/bare")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for n in counts:
        streams = [rng.standard_normal((tokens, d_model), dtype=np.float32).astype(stream_sum.BF16)
                   for _ in range(n)]
        wide = [s.astype(np.float32) for s in streams]
        acc = np.empty_like(wide[0])

        def bare(wide: list[np.ndarray] = wide, acc: np.ndarray = acc) -> None:
            np.add(wide[0], wide[1], out=acc)
            for w in wide[2:]:
                np.add(acc, w, out=acc)

        sum_s = _median_seconds(lambda s=streams: stream_sum.sum_streams(s), args.repeats)
        bare_s = _median_seconds(bare, args.repeats)
        in_bytes = sum(s.nbytes for s in streams)
        bare_bytes = sum(w.nbytes for w in wide)
        print(f"| {n} | {in_bytes / sum_s / 1e9:.2f} | {bare_bytes / bare_s / 1e9:.2f} | {bare_s / sum_s:.2f} |",
              flush=True)


def bench_kivi(args: argparse.Namespace) -> None:
    # One layer of a Llama-3-8B-like model (8 KV heads, head_dim 128) as the codec sees it: [2·heads, tokens, hd].
    rows, tokens, head_dim = 16, (256 if args.quick else 2048), 128
    kv = np.random.default_rng(0).standard_normal((rows, tokens, head_dim), dtype=np.float32).astype(DTYPES["bfloat16"])
    print(f"\n# KIVI-style requantisers: [{rows}, {tokens}, {head_dim}] BF16, group 32, one core, median of "
          f"{args.repeats}; GB/s of input BF16 bytes; ratio = bare time / kernel time")

    def bare(x: np.ndarray = kv) -> None:
        # Groups of 32 tokens per channel (the keys' grouping), reduced across rows of head_dim: numpy's fast axis.
        wide = x.astype(np.float32).reshape(-1, 32, x.shape[-1])
        mn = wide.min(axis=1, keepdims=True)
        inv = np.float32(3) / np.maximum(wide.max(axis=1, keepdims=True) - mn, np.float32(1e-30))
        np.rint((wide - mn) * inv)

    bare_s = _median_seconds(bare, args.repeats)
    header = ("codec", "encode GB/s", "decode GB/s", "bare min/max+rint GB/s", "encode/bare")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for name in ("kivi-2", "kivi-3"):
        codec = get_codec(name)
        enc = codec.encode(kv)
        enc_s = _median_seconds(lambda c=codec: c.encode(kv), args.repeats)
        dec_s = _median_seconds(lambda c=codec, e=enc: c.decode(e.header, e.payload), args.repeats)
        print(f"| {name} | {kv.nbytes / enc_s / 1e9:.3f} | {kv.nbytes / dec_s / 1e9:.3f} | "
              f"{kv.nbytes / bare_s / 1e9:.3f} | {bare_s / enc_s:.2f} |", flush=True)


if __name__ == "__main__":
    main()
