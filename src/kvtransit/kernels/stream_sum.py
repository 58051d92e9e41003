"""The all-reduce's in-network sum (docs/reference.md §7, tensor parallelism "in the network (a switch that sums)"):
N BF16 streams of equal shape summed elementwise into one BF16 stream.

    total = sum_streams([rank0, rank1, ...])     # each a bfloat16 array of one shape; → bfloat16, that shape

Precision: the sum is accumulated in float32 and rounded to BF16 once, at the end. That is what a switch
that sees every stream at one point does: NVLink SHARP's reduction, `multimem.ld_reduce…add.acc::f32` on
bf16x2 (PTX ISA), accumulates in float32 and returns BF16. NCCL's ring and tree all-reduces instead round at
every hop: `FuncSum<__nv_bfloat16>` adds two values (`__hadd`, or float32 add and `__float2bfloat16` before
sm_80) and the partial sum travels in BF16, so N ranks round N − 1 times, in ring order. For two streams
both are one add rounded once, and agree bit for bit. Widening BF16 to float32 is exact (BF16 is float32's
top 16 bits); float32 → BF16 rounds to nearest, ties to even (ml_dtypes).

What holds, exactly:
- Two streams: the result is a + b rounded once to BF16, i.e. the correctly rounded sum; a float32 add of
  two BF16 values is exact unless their exponents differ by more than 16, and then the smaller is far below
  half a BF16 ulp of the larger, so rounding it away changes nothing. Commutative exactly.
- N ≥ 3 streams: float32 addition is not associative, so the order of the streams can change the last bits
  of a partial sum and, rarely, the BF16 result. Bound: |result − exact| ≤ ½ BF16 ulp of the result +
  (N − 1)·2^−24·Σ|x_i| (the float32 accumulation). The order does not matter when every partial sum is
  exact in float32 (e.g. all the values within 16 − log2 N binades of each other).
- NaN and ±Inf propagate as IEEE arithmetic says, and a sum beyond BF16's range becomes ±Inf, as on a GPU
  (with N ≥ 3, so can a float32 partial sum beyond float32's range, which is BF16's); the all-reduce does not
  judge its operands.

Cost (docs/reference.md §5: "summing two streams (all-reduce) = 0.50 op/byte (needs a switch)"): one add per output
value for two streams, N − 1 for N. Counted per byte of *one* input stream (2 B per BF16 value), that is
1 add / 2 B = 0.50 op/B for two streams: docs/reference.md's figure. Counted per input byte across both streams
(4 B per add) it is 0.25 op/B; for N streams (N − 1) / (2N) op per input byte, which approaches 0.50 from
below, as docs/reference.md §7 puts it ("summing n streams costs 0.50 op per byte"). The declaration carries
docs/reference.md's 0.50 per input byte, which is at or above the true cost for any N (a safe bound for the budget
check), and placement "switch": every stream must reach one point.
"""

from __future__ import annotations

from collections.abc import Sequence

import ml_dtypes
import numpy as np

from kvtransit.kernels.errors import KernelInputError
from kvtransit.model.module.budget import BF16_BYTES, KernelDeclaration

BF16 = np.dtype(ml_dtypes.bfloat16)
# docs/reference.md §5: "summing two streams (all-reduce) = 0.50 op/byte (needs a switch)" (see the module docstring).
SUM_OPS_PER_BYTE = 0.50


def _check_streams(streams: Sequence[np.ndarray]) -> None:
    if len(streams) < 2:
        raise KernelInputError(f"sum_streams needs at least 2 streams, got {len(streams)}")
    for i, stream in enumerate(streams):
        if not isinstance(stream, np.ndarray):
            raise KernelInputError(f"stream {i} must be a numpy array, got {type(stream).__name__}")
        if stream.dtype != BF16:
            raise KernelInputError(f"stream {i} has dtype {stream.dtype}, every stream must be bfloat16")
        if stream.shape != streams[0].shape:
            raise KernelInputError(f"stream {i} has shape {stream.shape}, stream 0 has {streams[0].shape}")


def sum_streams(streams: Sequence[np.ndarray]) -> np.ndarray:
    """The elementwise sum of N ≥ 2 bfloat16 arrays of one shape, accumulated in float32 in stream order and
    rounded once to bfloat16 (a new C-ordered array; the inputs are not modified)."""
    _check_streams(streams)
    total = np.array(streams[0], dtype=np.float32, order="C")  # exact widening, and a copy we may add into
    # Overflow to ±Inf and Inf − Inf = NaN are the IEEE results the all-reduce passes on, not errors here.
    with np.errstate(over="ignore", invalid="ignore"):
        for stream in streams[1:]:
            np.add(total, stream, out=total)  # the BF16 operand is widened to float32 inside the loop, exactly
        summed: np.ndarray = total.astype(BF16)  # the one rounding: to nearest, ties to even
    return summed


def ops_per_input_byte(n_streams: int) -> float:
    """The true cost per input byte across all N streams: N − 1 adds per value over N × 2 B = (N − 1) / (2N)."""
    if n_streams < 2:
        raise KernelInputError(f"a sum needs at least 2 streams, got {n_streams}")
    return (n_streams - 1) / (n_streams * BF16_BYTES)


def declaration(n_streams: int = 2) -> KernelDeclaration:
    """The sum as a module kernel: floating-point adds (published), 0.50 op per input byte as docs/reference.md §5
    states it (≥ `ops_per_input_byte(n)` for every n), on a switch; ratio n (n streams in, one out)."""
    if n_streams < 2:
        raise KernelInputError(f"a sum needs at least 2 streams, got {n_streams}")
    return KernelDeclaration(
        "all-reduce-sum",
        ratio=float(n_streams),
        ops_per_byte=SUM_OPS_PER_BYTE,
        op_types=frozenset({"float"}),
        placement="switch",
        streams=n_streams,  # it needs every stream at one point: a pluggable is refused (placement_check)
    )
