"""What the built-in codecs and kernels cost on the module, as declarations (docs/reference.md §5).

Two lists, both from docs/reference.md §5:
- `CODECS`: the presets a link can run (none, fp8, fp4-block, freq-keep-k, kivi-2, kivi-3), built by
  `codec_declaration`.
- `KERNEL_TABLE_ROWS`: the four rows of the kernel table, which `kernel_table_row` turns back into the
  table's columns.

Inconsistencies in docs/reference.md §5 and how they are resolved here:
- The fp8 preset is "1 op per value", i.e. 0.50 op/byte on BF16 input, but the kernel table's "Requantise
  BF16 to FP8 (per-block scale)" row says 1.00 op/byte. They are kept apart: the table row is an oracle and
  keeps its printed 1.00 (a per-block scale costs a scale multiply besides the rounding: 2 ops per value);
  the fp8 *preset* keeps its stated 1 op per value = 0.50 op/byte. Either way it needs rounding, so the
  budget verdict (not allowed) is the same.
- The table's "fits" columns are arithmetic only (requantise is "in set: no" but "fits high: yes"), so
  `kernel_table_row` calls `fits_budget(..., require_published_ops=False)`.
- A per-block scale also needs a comparison (the block's absolute maximum); docs/reference.md names only rounding
  as the unpublished op these kernels need, and so do the declarations here.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvtransit.model.catalog.spec_text import as_bool, as_float, as_int, parse_key_values
from kvtransit.model.errors import ConfigError, unknown_name
from kvtransit.model.module.budget import (
    BF16_BYTES,
    BUDGET_HIGH_OPS_PER_BYTE,
    BUDGET_LOW_OPS_PER_BYTE,
    KernelDeclaration,
    fits_budget,
)

# docs/reference.md §5 codec presets (ratio = input bytes / output bytes).
FP8_RATIO = 2.0  # BF16 → FP8: 16 bits → 8 bits
FP8_OPS_PER_VALUE = 1  # "1 op per value; needs rounding"
FP4_OPS_PER_VALUE = 2  # "2 ops per value"
FP4_BITS = 4
# fp4-block is OCP MXFP4 (as `kernels/quant.py` runs it): 32 values share one 1-byte E8M0 scale, so 64 bytes
# of BF16 become 16 bytes of codes + 1 byte of scale: ratio 64/17 ≈ 3.765, docs/reference.md §5's figure.
DEFAULT_FP4_BLOCK = 32
FP4_SCALE_BYTES = 1
DEFAULT_KEEP = 0.5  # freq-keep-k keeps half, counted in real values (docs/reference.md §5, §6)
DEFAULT_TRANSFORM_LENGTH = 64  # tokens per FFT block along the token axis (the simulator's stage)
# The band-keep codec's default variant is the DCT-II (FreqKV, docs/reference.md §6; `kernels/registry.py`), which
# takes any block length >= 2; it runs on the module's FFT and is charged as one.
DEFAULT_BAND_KEEP_TRANSFORM = "dct"
# The band-keep kernels in the kernel table keep half the band (a fixed band; the ratio does not enter the
# table's columns, only the wire bytes).
TABLE_BAND_KEEP = 0.5
TABLE_REQUANTISE_OPS_PER_BYTE = 1.00  # docs/reference.md §5 kernel table, printed as is (see the module docstring)

# KIVI-style requantisers (docs/reference.md §5: KIVI arXiv:2402.02750, 2-bit; KVQuant arXiv:2401.18079, 3-bit), as
# `kernels/kivi.py` runs them: asymmetric, keys grouped per channel along tokens, values per token along channels,
# G = 32 values a group (KIVI's group size), each group storing a float16 step and a float16 zero point.
# The one ratio a preset declares assumes whole groups: tokens and head_dim multiples of 32 (head_dim 128, as the
# catalogue's models; a chunk of 32·k tokens). Then every 32 values (64 bytes of BF16) are 32·bits/8 bytes of codes
# plus 4 bytes: kivi-2 64/12 = 16/3 ≈ 5.33, kivi-3 64/16 = 4.0. A ragged last group of tokens costs its 4 bytes for
# fewer values, so a live payload is at most that much larger (tests/unit/test_kivi.py checks both).
KIVI_GROUP = 32
KIVI_GROUP_BYTES = 4  # float16 step + float16 zero point
KIVI_BITS = {"kivi-2": 2, "kivi-3": 3}
# Ops per value, forward: a comparison each for the group's min and max, a subtract (the zero point) and a multiply
# (by 1/step), and the rounding: 5. The per-group step (one subtract, one divide) is amortised over 32 values
# (0.06 per value, not counted); packing codes into bytes is wiring. Rounding and comparison are unpublished, so
# the count never changes the verdict (refused, or on the host, by policy), only what the GPU baseline is charged.
KIVI_OPS_PER_VALUE = 5

CODEC_NAMES = ("none", "fp8", "fp4-block", "freq-keep-k", "kivi-2", "kivi-3")


def kivi_ratio(bits: int, group: int = KIVI_GROUP) -> float:
    """BF16 bytes over wire bytes for whole groups: `group` values → group·bits/8 bytes of codes + 4 bytes."""
    return (BF16_BYTES * group) / (group * bits / 8 + KIVI_GROUP_BYTES)


def fp4_block_ratio(block: int) -> float:
    """`block` BF16 values (2·block bytes) become block/2 bytes of 4-bit codes plus one 1-byte scale."""
    if isinstance(block, bool) or not isinstance(block, int) or block < 2 or block % 2:
        raise ConfigError(f"fp4 block must be an even integer >= 2 values, got {block!r}")
    return (BF16_BYTES * block) / (block * FP4_BITS / 8 + FP4_SCALE_BYTES)


def codec_declaration(
    name: str, keep: float = DEFAULT_KEEP, block: int = DEFAULT_FP4_BLOCK,
    transform_length: int = DEFAULT_TRANSFORM_LENGTH, transform: str = DEFAULT_BAND_KEEP_TRANSFORM,
) -> KernelDeclaration:
    """The declaration of the codec preset `name`. `keep` is for freq-keep-k, `block` for fp4-block (the live
    codec's format fixes it at DEFAULT_FP4_BLOCK; other blocks are arithmetic for `kvtransit calc`).

    freq-keep-k's `transform` is "dct" (its codec's default variant, any block >= 2) or "fft" (a power of
    two); both cost the same (`model/module/budget.py`).
    """
    if name == "none":
        return KernelDeclaration("none", ratio=1.0)
    if name == "fp8":
        return KernelDeclaration(
            "fp8", ratio=FP8_RATIO, ops_per_byte=FP8_OPS_PER_VALUE / BF16_BYTES, op_types=frozenset({"rounding"})
        )
    if name == "fp4-block":
        return KernelDeclaration(
            "fp4-block",
            ratio=fp4_block_ratio(block),
            ops_per_byte=FP4_OPS_PER_VALUE / BF16_BYTES,
            op_types=frozenset({"rounding"}),
        )
    if name == "freq-keep-k":
        if not 0 < keep <= 1:
            raise ConfigError(f"freq-keep-k: keep must be in (0, 1], got {keep!r}")
        # The FFT runs in passive optics, so it costs the budget nothing (the simulator's stage).
        return KernelDeclaration(
            "freq-keep-k",
            ratio=1 / keep,
            op_types=frozenset({"fft"}),
            transform_charged=False,
            transform_length=transform_length,
            transform=transform,
        )
    if name in KIVI_BITS:
        return KernelDeclaration(
            name,
            ratio=kivi_ratio(KIVI_BITS[name]),
            ops_per_byte=KIVI_OPS_PER_VALUE / BF16_BYTES,
            op_types=frozenset({"rounding", "comparison"}),
        )
    raise unknown_name("codec", name, CODEC_NAMES)


CODECS: dict[str, KernelDeclaration] = {name: codec_declaration(name) for name in CODEC_NAMES}


def _band_keep_row(n: int) -> KernelDeclaration:
    return KernelDeclaration(
        f"FFT length {n}, keep a fixed band",
        ratio=1 / TABLE_BAND_KEEP,
        op_types=frozenset({"fft"}),
        transform_charged=False,
        transform_length=n,
        transform="fft",
    )


# docs/reference.md §5 kernel table, in its order.
KERNEL_TABLE_ROWS: tuple[KernelDeclaration, ...] = (
    _band_keep_row(8),
    _band_keep_row(64),
    _band_keep_row(1024),
    KernelDeclaration(
        "Requantise BF16 to FP8 (per-block scale)",
        ratio=FP8_RATIO,
        ops_per_byte=TABLE_REQUANTISE_OPS_PER_BYTE,
        op_types=frozenset({"rounding"}),
    ),
)


@dataclass(frozen=True)
class KernelTableRow:
    """One row of docs/reference.md §5's kernel table, computed from a declaration."""

    name: str
    transform_ops_per_byte: float
    other_ops_per_byte: float
    in_set: bool
    fits_high_transform_charged: bool
    fits_low_transform_free: bool


def kernel_table_row(decl: KernelDeclaration) -> KernelTableRow:
    return KernelTableRow(
        name=decl.name,
        transform_ops_per_byte=decl.transform_ops_per_byte,
        other_ops_per_byte=decl.ops_per_byte,
        in_set=decl.in_published_set,
        fits_high_transform_charged=fits_budget(
            decl, BUDGET_HIGH_OPS_PER_BYTE, transform_charged=True, require_published_ops=False
        ),
        fits_low_transform_free=fits_budget(
            decl, BUDGET_LOW_OPS_PER_BYTE, transform_charged=False, require_published_ops=False
        ),
    )


_DECLARATION_KEYS = frozenset(
    {"name", "ratio", "ops_per_byte", "op_types", "transform_charged", "transform", "transform_length",
     "precision_bits", "placement", "lossless", "streams"}
)


def parse_kernel_declaration(text: str) -> KernelDeclaration:
    """`name=k,ratio=2,ops_per_byte=0.5,op_types=fft+gather,transform=fft,transform_length=64,...`

    Every field of `KernelDeclaration` by its name; op_types joined by `+`; booleans yes/no.
    """
    kind = "kernel declaration"
    pairs = parse_key_values(text, kind, _DECLARATION_KEYS)
    if "name" not in pairs:
        raise ConfigError(f"{kind} {text!r}: missing name")
    kwargs: dict[str, object] = {"name": pairs["name"]}
    for key in ("ratio", "ops_per_byte"):
        if key in pairs:
            kwargs[key] = as_float(kind, key, pairs[key])
    for key in ("transform_length", "precision_bits", "streams"):
        if key in pairs:
            kwargs[key] = as_int(kind, key, pairs[key])
    for key in ("transform_charged", "lossless"):
        if key in pairs:
            kwargs[key] = as_bool(kind, key, pairs[key])
    for key in ("transform", "placement"):
        if key in pairs:
            kwargs[key] = pairs[key]
    if "op_types" in pairs:
        kwargs["op_types"] = frozenset(op.strip() for op in pairs["op_types"].split("+") if op.strip())
    return KernelDeclaration(**kwargs)  # type: ignore[arg-type]
