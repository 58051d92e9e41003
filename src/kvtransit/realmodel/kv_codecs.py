"""A cache's K and V through the middlebox's own codecs, or through token subsampling at equal bytes. numpy only.

What the middlebox does to a hand-off, layer by layer (agents/common/kv_frames.py): a layer's KV [2 (K, V),
kv_heads, tokens, head_dim] in the wire dtype (the prefill sends bfloat16) is one chunk of rows [2·kv_heads,
tokens, head_dim] (K heads, then V heads) whenever it fits kv_frames.MAX_CHUNK_BYTES (8 MiB; SmolLM2's layer is
6 rows × 8,192 tokens × 64 × 2 B = 6 MiB at its longest context, so always), and the kernel stage runs
`codec.encode(chunk)` on it; decode inverts it with `codec.decode(header, payload)`. This module does exactly
that, with `kernels.registry.get_codec` and the parameters the middlebox passes (`kernel.py: activate`;
band-keep's sinks capped at the prompt length as `kv_frames.codec_for` caps them).

A `CodecSpec` names one setting; its `name` is what `--codecs` takes back (`parse_specs`):

    none | fp8 | fp4-block | kivi-2 | kivi-3                              the requantisers, default parameters
    freq-keep-k/dct/keep=0.5/sinks=4[/bits=8][/pre-rope]                 band-keep (block 64 unless /block=N)
    subsample/keep=0.5/sinks=4                                           token subsampling at band-keep's bytes

Token subsampling at equal bytes: it keeps exactly as many tokens as band-keep's payload holds rows at the same
keep, block and sinks (`BandKeepLayout.kept_tokens`: the sinks plus ⌈keep·64⌉ coefficients per 64-token block
and ⌈keep·tail⌉ of the ragged tail), so both move the same bytes. The kept tokens are the first `sinks`, then
the rest spread evenly over the remaining tokens and aligned to the end, so the last token is always kept:
index T−1−⌊i·(T−sinks)/m⌋ for i = 0..m−1 (m tokens to place) — keep 0.5 is every 2nd token, 0.25 every 4th,
0.75 three of every four. The dropped tokens are not sent and not attended to (evicted, as StreamingLLM or H2O
evict), and the kept keys keep their own positions (they are rotated already).

`precision_bits` is the analogue path's limited precision (docs/reference.md §5: what the optical transform delivers),
modelled as the band-keep codec models it (kernels/bandkeep.py: uniform noise of a `bits`-bit quantiser on each
block's coefficients, seeded): it exists only where a transform runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvtransit.kernels.bandkeep import DEFAULT_BLOCK, layout_for
from kvtransit.kernels.header import WIRE_DTYPES
from kvtransit.kernels.quant import DEFAULT_FP8_BLOCK
from kvtransit.kernels.registry import Codec, get_codec
from kvtransit.model.judge.task_accuracy import BAND_KEEP, KEYS_POST_ROPE, KEYS_PRE_ROPE, SUBSAMPLE, codec_key
from kvtransit.realmodel.errors import RealModelError

REQUANTISERS: tuple[str, ...] = ("none", "fp8", "fp4-block", "kivi-2", "kivi-3")
# The accuracy grid (docs/reference.md §6.4), with docs/reference.md §6's FreqKV setting (dct, keep 0.5, 4 sinks).
KEEPS: tuple[float, ...] = (0.25, 0.5, 0.75)
SINK_SETTINGS: tuple[int, ...] = (0, 4)  # without sinks, and FreqKV's 4 (docs/reference.md §6)
VARIANTS: tuple[str, ...] = ("dct", "fft")
FREQKV_SINKS = 4
# The analogue path's precision, 4..12 bits ("the analogue path's precision_bits (4…12)"); docs/reference.md
# §5's deck sketch says 8.
PRECISION_BITS: tuple[int, ...] = tuple(range(4, 13))
# Families `--codecs` accepts as shorthands for a part of the default grid.
FAMILIES: tuple[str, ...] = (*REQUANTISERS, BAND_KEEP, SUBSAMPLE, "precision-bits", "pre-rope", "all")


@dataclass(frozen=True)
class CodecSpec:
    """One codec setting. `codec` is a registry name or "subsample"; the rest apply where they mean something."""

    codec: str
    keep: float | None = None
    sinks: int | None = None
    variant: str | None = None
    precision_bits: int | None = None
    block: int | None = None
    keys: str = KEYS_POST_ROPE

    @property
    def name(self) -> str:
        """What `--codecs` takes, and what the tables show."""
        if self.codec == BAND_KEEP:
            parts = [BAND_KEEP, str(self.variant), f"keep={self.keep:g}", f"sinks={self.sinks}"]
            if self.block != DEFAULT_BLOCK:
                parts.append(f"block={self.block}")
            if self.precision_bits is not None:
                parts.append(f"bits={self.precision_bits}")
            if self.keys == KEYS_PRE_ROPE:
                parts.append(KEYS_PRE_ROPE)
            return "/".join(parts)
        if self.codec == SUBSAMPLE:
            block = "" if self.block == DEFAULT_BLOCK else f"/block={self.block}"
            return f"{SUBSAMPLE}/keep={self.keep:g}/sinks={self.sinks}{block}"
        return self.codec

    @property
    def key(self) -> str:
        """The results file's key (model/judge/task_accuracy.py), the one a run's scenario gives too."""
        return codec_key(self.codec, keep=self.keep, block=self.block, sinks=self.sinks, variant=self.variant,
                         precision_bits=self.precision_bits, keys=self.keys)

    def codec_for(self, tokens: int) -> Codec:
        """The kernels' codec, with the parameters the middlebox passes (band-keep's sinks capped at `tokens`)."""
        if self.codec == BAND_KEEP:
            assert self.keep is not None and self.sinks is not None and self.variant is not None
            return get_codec(BAND_KEEP, keep=self.keep, block=self.block, sinks=min(self.sinks, tokens),
                             variant=self.variant, precision_bits=self.precision_bits)
        if self.codec == "fp8":
            return get_codec("fp8", block=self.block)
        return get_codec(self.codec)


def band_keep(variant: str, keep: float, sinks: int, *, precision_bits: int | None = None,
              keys: str = KEYS_POST_ROPE, block: int = DEFAULT_BLOCK) -> CodecSpec:
    return CodecSpec(BAND_KEEP, keep, sinks, variant, precision_bits, block, keys)


def subsample(keep: float, sinks: int, block: int = DEFAULT_BLOCK) -> CodecSpec:
    return CodecSpec(SUBSAMPLE, keep, sinks, block=block)


def requantiser(name: str) -> CodecSpec:
    return CodecSpec(name, block=DEFAULT_FP8_BLOCK if name == "fp8" else None)


def family(name: str) -> list[CodecSpec]:
    """The default grid's specs of one family (FAMILIES)."""
    if name in REQUANTISERS:
        return [requantiser(name)]
    if name == BAND_KEEP:
        return [band_keep(v, k, s) for v in VARIANTS for k in KEEPS for s in SINK_SETTINGS]
    if name == SUBSAMPLE:
        return [subsample(k, s) for k in KEEPS for s in SINK_SETTINGS]
    if name == "precision-bits":
        # On the FreqKV kernel (dct, keep 0.5, 4 sinks), and on the transform alone (keep 1, no sinks: every value
        # crosses the analogue path and nothing is dropped), so the noise's own cost can be read apart.
        return ([band_keep("dct", 0.5, FREQKV_SINKS, precision_bits=b) for b in PRECISION_BITS]
                + [band_keep("dct", 1.0, 0, precision_bits=b) for b in PRECISION_BITS])
    if name == "pre-rope":
        return [band_keep("dct", k, FREQKV_SINKS, keys=KEYS_PRE_ROPE) for k in KEEPS]
    if name == "all":
        return default_specs()
    raise RealModelError(f"unknown codec family {name!r} (choose from: {', '.join(FAMILIES)})")


def default_specs() -> list[CodecSpec]:
    """Every codec setting the default end-to-end run measures."""
    specs = [requantiser(name) for name in REQUANTISERS]
    for name in (BAND_KEEP, SUBSAMPLE, "precision-bits", "pre-rope"):
        specs += family(name)
    return specs


def parse_spec(text: str) -> CodecSpec:
    """One spec from its `name` (see the module docstring)."""
    parts = [p.strip() for p in text.split("/")]
    head, rest = parts[0], parts[1:]
    if head in REQUANTISERS and not rest:
        return requantiser(head)
    if head not in (BAND_KEEP, SUBSAMPLE):
        raise RealModelError(f"--codecs: {text!r} is not a codec ({', '.join(REQUANTISERS)}), a family "
                             f"({', '.join(FAMILIES[len(REQUANTISERS):])}) or a setting like "
                             f"{BAND_KEEP}/dct/keep=0.5/sinks=4 or {SUBSAMPLE}/keep=0.5/sinks=4")
    fields: dict[str, str] = {}
    variant, keys = None, KEYS_POST_ROPE
    for part in rest:
        name, eq, value = part.partition("=")
        if eq:
            fields[name] = value
        elif part in VARIANTS and head == BAND_KEEP:
            variant = part
        elif part == KEYS_PRE_ROPE and head == BAND_KEEP:
            keys = KEYS_PRE_ROPE
        else:
            raise RealModelError(f"--codecs: {text!r}: unknown part {part!r}")
    allowed = {"keep", "sinks", "block"} | ({"bits"} if head == BAND_KEEP else set())
    unknown = sorted(set(fields) - allowed)
    if unknown or "keep" not in fields or "sinks" not in fields:
        raise RealModelError(f"--codecs: {text!r} needs keep= and sinks= (and takes only {', '.join(sorted(allowed))})")
    try:
        keep, sinks = float(fields["keep"]), int(fields["sinks"])
        block = int(fields.get("block", DEFAULT_BLOCK))
        bits = int(fields["bits"]) if "bits" in fields else None
    except ValueError:
        raise RealModelError(f"--codecs: {text!r}: keep must be a number, sinks/block/bits whole numbers") from None
    if not 0 < keep <= 1 or sinks < 0 or block < 2:
        raise RealModelError(f"--codecs: {text!r}: keep must be in (0, 1], sinks >= 0, block >= 2")
    if head == SUBSAMPLE:
        return subsample(keep, sinks, block)
    if variant is None:
        raise RealModelError(f"--codecs: {text!r} needs a variant ({' or '.join(VARIANTS)})")
    return band_keep(variant, keep, sinks, precision_bits=bits, keys=keys, block=block)


def parse_specs(text: str) -> list[CodecSpec]:
    """"none,fp8,freq-keep-k/dct/keep=0.5/sinks=4,subsample" → specs, families expanded, duplicates dropped."""
    specs: list[CodecSpec] = []
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        for spec in (family(item) if item in FAMILIES else [parse_spec(item)]):
            if spec not in specs:
                specs.append(spec)
    if not specs:
        raise RealModelError(f"--codecs: no codec in {text!r}")
    return specs


# --- applying a spec --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Outcome:
    """A cache after a spec: per layer the decoded rows [2·kv_heads, tokens, head_dim] in the wire dtype (None
    for subsampling), the tokens kept (None: all of them, at reduced fidelity), and the bytes."""

    layers: list[np.ndarray] | None
    kept: np.ndarray | None
    wire_bytes: int
    raw_bytes: int

    @property
    def bytes_ratio(self) -> float:
        return self.wire_bytes / self.raw_bytes


def to_wire(rows: np.ndarray, wire_dtype: str) -> np.ndarray:
    """float32 rows in the wire dtype (round to nearest even, as the prefill's cast)."""
    if wire_dtype not in WIRE_DTYPES:
        raise RealModelError(f"unknown wire dtype {wire_dtype!r} (choose from: {', '.join(WIRE_DTYPES)})")
    return np.ascontiguousarray(rows.astype(WIRE_DTYPES[wire_dtype]))


def subsample_indices(tokens: int, keep: float, sinks: int, block: int = DEFAULT_BLOCK) -> np.ndarray:
    """The tokens subsampling keeps at band-keep's bytes (module docstring), sorted."""
    sinks = min(sinks, tokens)
    kept = layout_for((1, tokens, 1), keep, block, sinks, "dct").kept_tokens
    rest = kept - sinks
    span = tokens - sinks
    tail = tokens - 1 - (np.arange(rest) * span) // max(rest, 1)
    return np.concatenate([np.arange(sinks), np.sort(tail)]).astype(np.int64)


def apply(spec: CodecSpec, layers: Sequence[np.ndarray]) -> Outcome:
    """`layers`: per layer the rows [2·kv_heads, tokens, head_dim] in the wire dtype, as the middlebox gets them."""
    raw = sum(rows.nbytes for rows in layers)
    tokens = layers[0].shape[-2]
    if spec.codec == SUBSAMPLE:
        assert spec.keep is not None and spec.sinks is not None and spec.block is not None
        kept = subsample_indices(tokens, spec.keep, spec.sinks, spec.block)
        return Outcome(None, kept, raw * kept.size // tokens, raw)
    codec = spec.codec_for(tokens)
    decoded, wire = [], 0
    for rows in layers:
        encoded = codec.encode(rows)
        wire += encoded.wire_bytes
        decoded.append(codec.decode(encoded.header, encoded.payload))
    return Outcome(decoded, None, wire, raw)
