"""Model shapes and what they weigh: KV bytes per token, matmul parameters, weights (docs/reference.md §1, §3).

A model is its shape; every byte count the emulator uses is derived here from that shape, so a user can
add a model by giving its shape (`ModelSpec.from_shape("layers=32,d_model=4096,...")`).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvtransit.model.catalog.spec_text import as_int, parse_key_values
from kvtransit.model.errors import ConfigError, require_positive, unknown_name

# BF16: 2 bytes per value (docs/reference.md §1).
BF16_BYTES = 2
# K and V (docs/reference.md §1).
KV_TENSORS = 2


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer's shape. Every layer is an attention layer (true of every catalogued model).

    For a mixture of experts, `d_ff` is one expert's width: the per-token compute counts `experts_active`
    experts, the resident weights count all `experts`.
    """

    name: str
    layers: int
    d_model: int
    n_heads: int
    kv_heads: int
    d_ff: int
    vocab: int
    experts: int = 1
    experts_active: int = 1
    bytes_per_value: int = BF16_BYTES

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigError("a model needs a name")
        for field_name in ("layers", "d_model", "n_heads", "kv_heads", "d_ff", "vocab", "experts",
                           "experts_active", "bytes_per_value"):
            value = getattr(self, field_name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"model {self.name!r}: {field_name} must be an integer, got {value!r}")
            require_positive(f"model {self.name!r}: {field_name}", value)
        if self.d_model % self.n_heads:
            raise ConfigError(f"model {self.name!r}: d_model {self.d_model} is not a multiple of heads {self.n_heads}")
        if self.n_heads % self.kv_heads:
            raise ConfigError(f"model {self.name!r}: heads {self.n_heads} "
                              f"is not a multiple of kv_heads {self.kv_heads}")
        if self.experts_active > self.experts:
            raise ConfigError(
                f"model {self.name!r}: experts_active {self.experts_active} > experts {self.experts}"
            )

    # --- shape ------------------------------------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def kv_bytes_per_token(self) -> int:
        """2 (K and V) × layers × kv_heads × head_dim × bytes per value (docs/reference.md §1)."""
        return KV_TENSORS * self.layers * self.kv_dim * self.bytes_per_value

    def kv_bytes(self, tokens: int) -> int:
        """The KV cache of `tokens` tokens: what one hand-off of a prompt of that length carries."""
        require_positive("tokens", tokens)
        return tokens * self.kv_bytes_per_token

    # --- parameters (docs/reference.md §3; norms and biases are left out, as there) -----------------------------
    def _layer_params(self, experts: int) -> int:
        d = self.d_model
        attention = 2 * d * d + 2 * d * self.kv_dim  # Q and O, K and V
        mlp = 3 * d * self.d_ff * experts  # gate, up, down (SwiGLU)
        return self.layers * (attention + mlp)

    @property
    def layer_params(self) -> int:
        """All the transformer layers' weights, every expert counted."""
        return self._layer_params(self.experts)

    @property
    def matmul_params(self) -> int:
        """L·(2d² + 2d·kv_dim + 3d·d_ff) + vocab·d: weights one token multiplies by (docs/reference.md §3).

        The embedding lookup is not a matmul, so the vocabulary counts once (the head). A mixture of
        experts counts its active experts only.
        """
        return self._layer_params(self.experts_active) + self.vocab * self.d_model

    @property
    def weights_streamed_bytes(self) -> int:
        """Weights read from HBM once per step: 2 × matmul_params in BF16 (docs/reference.md §3)."""
        return self.bytes_per_value * self.matmul_params

    @property
    def resident_weight_bytes(self) -> int:
        """2 × (layer params + 2·vocab·d): untied embedding and head (docs/reference.md §1, §3)."""
        return self.bytes_per_value * (self.layer_params + 2 * self.vocab * self.d_model)

    # --- construction from text -------------------------------------------------------------------------
    @classmethod
    def from_shape(cls, text: str, name: str = "custom") -> ModelSpec:
        """`layers=32,d_model=4096,heads=32,kv_heads=8,d_ff=14336,vocab=128256[,experts=8,experts_active=2]`."""
        kind = "model shape"
        pairs = parse_key_values(text, kind, _SHAPE_KEYS)
        if "heads" in pairs and "n_heads" in pairs:
            raise ConfigError(f"{kind}: give heads or n_heads, not both")
        if "heads" in pairs:
            pairs["n_heads"] = pairs.pop("heads")
        missing = sorted(_REQUIRED_SHAPE_KEYS - pairs.keys())
        if missing:
            shown = ["heads" if key == "n_heads" else key for key in missing]
            raise ConfigError(f"{kind} {text!r}: missing {', '.join(shown)}")
        name = pairs.pop("name", name)
        return cls(name=name, **{key: as_int(kind, key, value) for key, value in pairs.items()})


_REQUIRED_SHAPE_KEYS = frozenset({"layers", "d_model", "n_heads", "kv_heads", "d_ff", "vocab"})
_SHAPE_KEYS = _REQUIRED_SHAPE_KEYS | {"heads", "experts", "experts_active", "bytes_per_value", "name"}


def _model(name: str, layers: int, d_model: int, heads: int, kv_heads: int, d_ff: int, vocab: int,
           experts: int = 1, experts_active: int = 1) -> ModelSpec:
    return ModelSpec(name, layers, d_model, heads, kv_heads, d_ff, vocab, experts, experts_active)


# docs/reference.md §1: layers, d_model, heads / kv heads, d_ff, vocab.
MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        _model("llama3-8b", 32, 4096, 32, 8, 14336, 128256),
        _model("llama3-70b", 80, 8192, 64, 8, 28672, 128256),
        _model("mistral-7b", 32, 4096, 32, 8, 14336, 32000),
        _model("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, experts=8, experts_active=2),
        _model("llama3.2-1b", 16, 2048, 32, 8, 8192, 128256),
        _model("smollm2-135m", 30, 576, 9, 3, 1536, 49152),
    )
}


def model_by_name(name: str) -> ModelSpec:
    try:
        return MODELS[name]
    except KeyError:
        raise unknown_name("model", name, MODELS) from None
