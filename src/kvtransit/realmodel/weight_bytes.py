"""Real weights as the bytes a weight flow carries: SmolLM2-135M's tensors in BF16 (docs/reference.md §1, §7).

What a lossless kernel on the weight flow would see. The model comes from the realkv extra's GGUF file, loaded
by `session.py` (transformers de-quantises it to float32); each tensor is rounded to BF16 (round to nearest
even, torch's conversion) and laid out as little-endian 2-byte values, as a BF16 checkpoint stores them.

Caveat, said wherever a figure from here is reported: the file stores the projections as Q4_1 and the
embedding as Q8_0 (blocks of 32 values sharing a scale and an offset, 16 or 256 levels per block); only the
norms are stored at full precision (F32). De-quantised weights have fewer distinct values than the BF16
checkpoint they came from, so a lossless compressor could find more redundancy in them than in the original
(measured: once rounded to BF16 they compress within 0.07 of i.i.d. Gaussian values of the same spread,
docs/results/weights.md).

`python -m kvtransit.realmodel.weight_bytes` lists the tensors by kind with their BF16 bytes;
`benchmarks/weight_compression.py` measures zstd on them (docs/results/weights.md).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Iterator

import torch

from kvtransit.realmodel.session import Session

# How the GGUF file stores each kind of tensor (read from the file's tensor table with gguf's reader: 210 Q4_1,
# 61 F32, 1 Q8_0), by the name transformers gives it.
KIND_STORAGE = {"embedding": "Q8_0", "projection": "Q4_1", "norm": "F32"}


def weight_kind(name: str) -> str:
    """embedding, projection (attention q/k/v/o and MLP gate/up/down) or norm, from a transformers name."""
    if "embed_tokens" in name:
        return "embedding"
    if name.endswith("norm.weight"):
        return "norm"
    if name.endswith("_proj.weight"):
        return "projection"
    raise ValueError(f"unclassified weight tensor {name!r}")


def bf16_bytes(tensor: torch.Tensor) -> bytes:
    """The tensor rounded to BF16, as 2 little-endian bytes per value in row-major order."""
    as_bf16 = tensor.detach().to(torch.bfloat16).contiguous()
    return as_bf16.view(torch.int16).numpy().astype("<i2", copy=False).tobytes()


def real_weights(session: Session | None = None,
                 layers: Iterable[int] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, float32 tensor) for the embedding, the norms and, for `layers` (default all), the projections."""
    model = (session or Session()).model
    wanted = None if layers is None else {f".layers.{i}." for i in layers}
    for name, param in model.named_parameters():
        kind = weight_kind(name)
        if kind == "projection" and wanted is not None and not any(tag in name for tag in wanted):
            continue
        yield name, param.detach()


def main(argv: list[str] | None = None) -> int:
    del argv
    totals: dict[str, dict[str, int]] = {}
    for name, tensor in real_weights():
        kind = weight_kind(name)
        entry = totals.setdefault(kind, {"tensors": 0, "values": 0, "bf16_bytes": 0})
        entry["tensors"] += 1
        entry["values"] += tensor.numel()
        entry["bf16_bytes"] += 2 * tensor.numel()
    for kind, entry in totals.items():
        print(json.dumps({"kind": kind, "stored_as": KIND_STORAGE[kind], **entry}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
