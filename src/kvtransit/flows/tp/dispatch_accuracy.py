"""FP8 dispatch on real activations: the relative error the fp8 kernel puts on what an MoE
layer dispatches, measured on SmolLM2-135M's MLP inputs.

SmolLM2 is dense, so there is no router: every layer's MLP input (the post-attention RMSNorm's output, [tokens,
d]) is what a router would send to the experts, and it is what the dispatch link would carry. Each layer's
input is cast to BF16 (the wire's dtype), then through the same fp8 kernel the live ranks run
(kernels/registry.py: Fp8Codec, E4M3 with a float32 scale per 64 values, flattened in C order so a block is part of
one token's vector), and compared with the BF16 it started from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kvtransit.flows.tp.moe_dispatch import E4M3_HALF_ULP
from kvtransit.kernels.header import WIRE_DTYPES
from kvtransit.kernels.registry import Fp8Codec
from kvtransit.realmodel.session import Session
from kvtransit.realmodel.texts import read_text

# A context long enough for every layer's activations to settle past the first tokens' outliers, and short enough
# to keep the pass to a second or two on 2 cores (texts.py: the real-model tables use 1,024).
DISPATCH_TOKENS = 512
DISPATCH_TEXT = "gpl-3"
# A block's values far below its amax fall into E4M3's subnormals and may do worse than its half-ulp, so the
# whole-tensor error is reported against the half-ulp, not held to it value by value.
FP8_ROUNDING_BOUND = E4M3_HALF_ULP


@dataclass(frozen=True)
class DispatchAccuracy:
    relative_l2: float  # ‖x̂ − x‖ / ‖x‖ over every layer's MLP input
    worst_layer: int
    worst_layer_relative_l2: float
    tokens: int
    layers: int
    source: str

    def to_json(self) -> dict[str, Any]:
        return {"relative_l2": self.relative_l2, "worst_layer": self.worst_layer,
                "worst_layer_relative_l2": self.worst_layer_relative_l2, "tokens": self.tokens,
                "layers": self.layers, "bound": FP8_ROUNDING_BOUND, "source": self.source}


def fp8_dispatch_error(session: Session, *, tokens: int = DISPATCH_TOKENS,
                       text: str = DISPATCH_TEXT) -> DispatchAccuracy:
    """FP8's error on the MLP inputs of the first `tokens` tokens of `text` (texts.py)."""
    ids = session.tokenize(read_text(text))[:tokens]
    prefill = session.prefill(ids, mlp_inputs=True)
    assert prefill.mlp_inputs is not None  # asked for
    codec = Fp8Codec()
    err2 = ref2 = 0.0
    per_layer = []
    for x in prefill.mlp_inputs:
        wire = np.ascontiguousarray(x.numpy().astype(WIRE_DTYPES["bfloat16"]))
        encoded = codec.encode(wire)
        back = codec.decode(encoded.header, encoded.payload).astype(np.float64)
        ref = wire.astype(np.float64)
        e2, r2 = float(np.sum((back - ref) ** 2)), float(np.sum(ref ** 2))
        per_layer.append(np.sqrt(e2 / r2))
        err2, ref2 = err2 + e2, ref2 + r2
    worst = int(np.argmax(per_layer))
    return DispatchAccuracy(float(np.sqrt(err2 / ref2)), worst, float(per_layer[worst]), len(ids), len(per_layer),
                            f"{session.path.name}: every layer's MLP input over the first {len(ids)} tokens of "
                            f"{text}")
