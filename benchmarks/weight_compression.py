"""zstd, the lossless baseline a user would try on a weight flow, on SmolLM2-135M's real weights in BF16.

    python benchmarks/weight_compression.py [--layers 0 15 29] [--levels 1 3 9] [--json FILE]

Needs the realkv extra (the model) and `zstandard`. Per kind of tensor (the embedding, the chosen layers'
q/k/v/o/gate/up/down projections, all norms) it compresses the BF16 bytes (realmodel/weight_bytes.py) at each
level, as laid out (value after value) and byte-split (every value's high byte first, then every low byte: a fixed
permutation, no arithmetic, that puts sign + exponent bytes together), and prints the ratio (input / output)
and the compression speed on this CPU. Every compressed buffer is decompressed and compared with its input.

For reference, the same measurement on i.i.d. Gaussian BF16 values with each kind's standard deviation
(synthetic, labelled so: what full-precision weights of that spread would give, since the file's own weights
are de-quantised from Q4_1/Q8_0; see realmodel/weight_bytes.py's caveat).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
import zstandard

from kvtransit.realmodel.weight_bytes import KIND_STORAGE, bf16_bytes, real_weights, weight_kind


def byte_split(data: bytes) -> bytes:
    """High bytes of every BF16 value, then the low bytes (little-endian input)."""
    pairs = np.frombuffer(data, dtype=np.uint8).reshape(-1, 2)
    return pairs[:, 1].tobytes() + pairs[:, 0].tobytes()


def measure(data: bytes, level: int) -> dict[str, float]:
    compressor = zstandard.ZstdCompressor(level=level)
    start = time.perf_counter()
    packed = compressor.compress(data)
    seconds = time.perf_counter() - start
    if zstandard.ZstdDecompressor().decompress(packed) != data:
        raise SystemExit(f"zstd level {level}: round trip differs (not lossless?)")
    return {"ratio": len(data) / len(packed), "compress_MBps": len(data) / seconds / 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[0, 15, 29])
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 3, 9])
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()

    groups: dict[str, list[torch.Tensor]] = {}
    for name, tensor in real_weights(layers=args.layers):
        groups.setdefault(weight_kind(name), []).append(tensor.flatten())
    rows = []
    generator = torch.Generator().manual_seed(0)
    for kind, tensors in groups.items():
        values = torch.cat(tensors)
        real = bf16_bytes(values)
        gaussian = bf16_bytes(torch.randn(values.numel(), generator=generator) * values.std())
        for source, data in ((f"SmolLM2 {kind} ({KIND_STORAGE[kind]} in the file)", real),
                             (f"synthetic Gaussian, {kind}'s std", gaussian)):
            for layout, payload in (("as laid out", data), ("byte-split", byte_split(data))):
                for level in args.levels:
                    rows.append({"tensors": source, "kind": kind, "bf16_bytes": len(data), "layout": layout,
                                 "level": level, **measure(payload, level)})
                    r = rows[-1]
                    print(f"{source:48s} {len(data):>11,d} B  {layout:11s}  zstd-{level}: "
                          f"ratio {r['ratio']:.3f}  {r['compress_MBps']:7.1f} MB/s", flush=True)
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"layers": args.layers, "zstandard": zstandard.__version__,
                       "zstd": zstandard.ZSTD_VERSION, "rows": rows}, out, indent=1)


if __name__ == "__main__":
    main()
