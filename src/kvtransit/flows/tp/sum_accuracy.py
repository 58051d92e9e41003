"""The TP all-reduce's precision on real activations: BF16 partial sums of SmolLM2-135M's MLP down projection, as a
TP-n group's ranks would send them, summed by the switch's kernel (kernels/stream_sum.py: float32 accumulation,
one rounding to BF16) and by NCCL's ring (a BF16 rounding at every hop), each against the float64 sum of the same
partials.

A row-parallel down projection is where a TP MLP all-reduces: its input (act(gate(x)) · up(x), d_ff wide) is split
in n contiguous shards, rank r computes x_r · W_rᵀ in float32 and sends it as BF16; the all-reduce sums the n partials.
`partial_sums` makes them from the real model (the realkv extra); `sum_errors` is the arithmetic, on any partials.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvtransit.kernels.stream_sum import BF16, sum_streams

# As flows/tp/dispatch_accuracy.py: long enough for the activations to settle past the first tokens, short enough for
# a second or two of CPU; every sixth layer (first, middle and last included) keeps the pass and the arrays small.
SUM_TOKENS = 256
SUM_TEXT = "gpl-3"
SUM_LAYERS = (0, 6, 12, 18, 24, 29)
# BF16's unit roundoff (8 significant bits): a correctly rounded sum is within this, relatively, of the exact one.
BF16_UNIT_ROUNDOFF = 2.0 ** -8


def ring_sum(partials: Sequence[np.ndarray]) -> np.ndarray:
    """NCCL's ring (and tree) order: the running sum travels in BF16, rounded after every add (kernels/stream_sum.py's
    docstring: FuncSum<__nv_bfloat16>), rank 0 first."""
    acc = np.asarray(partials[0], dtype=BF16)
    for p in partials[1:]:
        acc = (acc.astype(np.float32) + np.asarray(p, dtype=BF16).astype(np.float32)).astype(BF16)
    return acc


def _relative_l2(ref: np.ndarray, got: np.ndarray) -> float:
    return float(np.linalg.norm(got.astype(np.float64) - ref) / np.linalg.norm(ref))


@dataclass(frozen=True)
class SumErrors:
    tp: int
    switch: float  # relative L2 of the switch's BF16 sum against the float64 sum of the same BF16 partials
    ring: float  # the same for NCCL's ring order
    switch_vs_layer: float  # the switch's sum against the layer's float64 output (the partials' own rounding in)
    values: int
    source: str

    def as_dict(self) -> dict[str, Any]:
        return {"tp": self.tp, "switch_relative_l2": self.switch, "ring_relative_l2": self.ring,
                "switch_vs_layer_relative_l2": self.switch_vs_layer, "values": self.values,
                "bf16_unit_roundoff": BF16_UNIT_ROUNDOFF, "source": self.source}


def sum_errors(layers: Sequence[tuple[Sequence[np.ndarray], np.ndarray]], tp: int, source: str) -> SumErrors:
    """Each layer's (BF16 partials, float64 exact layer output) summed both ways; errors pooled over the layers."""
    e_switch = e_ring = e_layer = r_sum = r_layer = 0.0
    values = 0
    for partials, exact in layers:
        ref = np.sum([np.asarray(p, dtype=BF16).astype(np.float64) for p in partials], axis=0)
        switch = sum_streams([np.asarray(p, dtype=BF16) for p in partials]).astype(np.float64)
        ring = ring_sum(partials).astype(np.float64)
        e_switch += float(np.sum((switch - ref) ** 2))
        e_ring += float(np.sum((ring - ref) ** 2))
        e_layer += float(np.sum((switch - exact) ** 2))
        r_sum += float(np.sum(ref ** 2))
        r_layer += float(np.sum(exact ** 2))
        values += ref.size
    return SumErrors(tp, float(np.sqrt(e_switch / r_sum)), float(np.sqrt(e_ring / r_sum)),
                     float(np.sqrt(e_layer / r_layer)), values, source)


def partial_sums(session: Any, tp: int, *, tokens: int = SUM_TOKENS, text: str = SUM_TEXT,
                 layers: Sequence[int] = SUM_LAYERS) -> list[tuple[list[np.ndarray], np.ndarray]]:
    """Per layer, the n ranks' BF16 partials of the down projection and its float64 output, on the first `tokens` of
    `text` (realmodel/texts.py)."""
    import torch

    from kvtransit.realmodel.texts import read_text

    ids = session.tokenize(read_text(text))[:tokens]
    prefill = session.prefill(ids, mlp_inputs=True)
    assert prefill.mlp_inputs is not None  # asked for
    out = []
    with torch.inference_mode():
        for i in layers:
            mlp = session.model.model.layers[i].mlp
            x = prefill.mlp_inputs[i]
            inner = (mlp.act_fn(mlp.gate_proj(x)) * mlp.up_proj(x)).float().numpy()  # [tokens, d_ff]
            w = mlp.down_proj.weight.float().numpy()  # [d_model, d_ff]
            if inner.shape[1] % tp:
                raise ValueError(f"TP {tp} does not divide the down projection's {inner.shape[1]} inputs")
            shard = inner.shape[1] // tp
            partials = [(inner[:, r * shard:(r + 1) * shard] @ w[:, r * shard:(r + 1) * shard].T).astype(BF16)
                        for r in range(tp)]
            exact = inner.astype(np.float64) @ w.T.astype(np.float64)
            out.append((partials, exact))
    return out


def switch_sum_errors(session: Any, tp: int) -> SumErrors:
    layers = partial_sums(session, tp)
    return sum_errors(layers, tp, f"{session.path.name}: the MLP down projection's TP-{tp} partial sums over the first "
                                  f"{SUM_TOKENS} tokens of {SUM_TEXT}, layers {', '.join(map(str, SUM_LAYERS))}")
