"""Which live implementation runs a declared kernel: one implementation per shape, chosen by transform.

A declaration (`KernelDeclaration`, the deck's `LinkKernel`, usually from a file: `kernel_file.py`) says what a
kernel costs; a live run is configured by `Scenario` fields. `scenario_fields_for` maps the one onto the other:
the fields of the ONE codec that computes what the declaration describes, or a `ConfigError` saying why none does.

Runnable on the KV hand-off (the shapes `RUNNABLE_SHAPES` lists in every refusal):
- transform dct|fft of length N, ratio N/k for a whole k in 1..N-1, op_types fft (+ gather, the kept band's
  wiring): band-keep, codec "freq-keep-k", variant = the transform, block = N, keep = k/N. The codec keeps
  `kept_count(N, keep)` = ⌈keep·N⌉ real coefficients a block (`kernels/bandkeep.py`), so a ratio that does not
  make k whole would run a different ratio than declared: refused, with the nearest ratios that do.
  The fft variant needs no more than that (any block >= 2, any kept count in 1..N, `kernels/registry.py`);
  the declaration already holds N to a power of two for fft (`model/module/budget.py`).
  Sinks: a declaration has no sink field, so the scenario's `sinks` stays as given (4 by default, FreqKV's,
  docs/reference.md §6); they travel exact ahead of the blocks, outside the declared ratio.
- transform none, rounding, ratio 2: codec "fp8"; ratio 64/17 ≈ 3.765: codec "fp4-block" (docs/reference.md §5 presets);
  rounding + comparison, ratio 4: codec "kivi-3", ratio 16/3 ≈ 5.333: codec "kivi-2" (KIVI-style, docs/reference.md §5;
  group 32, `model/catalog/codecs.py: kivi_ratio`).
- transform none, no ops, ratio 1: codec "none".
Refused: an NTT (ML-KEM polynomial multiplication) or a kernel that combines streams (a sum) belongs to the
ciphertext and collective flows (docs/reference.md §7), which do not run live yet; anything else matches no
implementation. Every refusal says why and lists the runnable shapes, or the nearest runnable ratios.

The declaration's transform_charged, precision_bits and placement become the same-named scenario fields, and
compress_at becomes "transit" (a declared kernel runs on the link, not on the prefill GPU). precision_bits
changes the bytes only for band-keep (the analogue path's noise on its coefficients, `kernels/registry.py`); for
the others it is carried as declared.

The declared cost must agree with the implementation's (`Scenario.codec_declaration` of the mapped fields,
which is also what the middlebox's kernel stage judges, `agents/middlebox/stages/kernel.py: activate`):
- op_types: every op the implementation needs must be declared (an fp8 without rounding is refused). Extra op
  types are accepted when they do not change whether the kernel needs an unpublished op (e.g. mac for the DCT's
  twiddles, or comparison beside rounding for a per-block maximum): the module's verdict is then the same.
- ops_per_byte: fewer than the implementation needs is refused. More is refused for a kernel that runs in the
  module, and accepted for one that needs an unpublished op (fp8, fp4-block), whose ops the module never
  charges (it is refused, or runs on the host, where ops are not counted; `Scenario.module_terms`).
So the budget check of the run uses the implementation's declaration, and the rules above make that the file's
cost wherever the module charges it: the live middlebox can only charge what its codec declares, so a file whose
in-transit cost differs would be judged on a cost the run does not apply.
Pure: no I/O.
"""

from __future__ import annotations

import math
from typing import Any

from kvtransit.model.catalog.codecs import CODECS
from kvtransit.model.errors import ConfigError
from kvtransit.model.module.budget import WIRING_OPS, KernelDeclaration
from kvtransit.model.scenario import Scenario

BAND_KEEP_TRANSFORMS = ("dct", "fft")  # the band-keep codec's variants (Scenario.variant, kernels/bandkeep.py)
# The live fp4-block codec takes one block only: MXFP4's 32 values per shared scale (`kernels/quant.py:
# FP4_BLOCK`, refused otherwise by `kernels/registry.py: get_codec`); model/ cannot import kernels/, and
# tests/unit/test_kernel_runs.py holds the two equal.
LIVE_FP4_BLOCK = 32
# A declared ratio matches a requantiser preset within 0.5 %: docs/reference.md §5 prints fp4-block's 64/17 as 3.765,
# and a file cannot write a fraction (TOML and JSON numbers), so a ratio copied to 3 significant figures (3.76, 3.77: at
# most 0.14 % off) must match; the closest presets (fp4-block 3.765 and kivi-3 4.0) are 6 % apart, so no ratio matches
# two.
RATIO_MATCH_REL_TOL = 5e-3
# Numbers a file states "agree" when equal up to float error in its decimals (0.1 + 0.2 style): not a modelling
# tolerance (ops_per_byte, ratio 1, a whole kept count).
_FLOAT_REL_TOL = 1e-9
_FLOAT_ABS_TOL = 1e-12
# transform none, rounding: matched by ratio (docs/reference.md §5 presets; the kivi ones also need comparison)
ROUNDING_CODECS = ("fp8", "fp4-block", "kivi-2", "kivi-3")

# Where NTT kernels and stream sums belong (docs/reference.md §7: ciphertexts; the tensor-parallel all-reduce).
_OTHER_FLOWS = ("it belongs to the ciphertext and collective flows (docs/reference.md §7), which do not run live yet, "
                "not to the KV hand-off")
RUNNABLE_SHAPES = (
    "band-keep (transform dct|fft, transform_length N, op_types fft[+gather], ratio N/k for a whole k in 1..N-1), "
    "fp8 (transform none, op_types rounding, ratio 2), fp4-block (transform none, op_types rounding, "
    "ratio 64/17 ≈ 3.765), kivi-3 (transform none, op_types rounding+comparison, ratio 4), kivi-2 (transform "
    "none, op_types rounding+comparison, ratio 16/3 ≈ 5.333), none (transform none, no ops, ratio 1)"
)


def _refuse(decl: KernelDeclaration, reason: str) -> ConfigError:
    return ConfigError(f"kernel {decl.name!r}: {reason}")


def _not_runnable(decl: KernelDeclaration, reason: str) -> ConfigError:
    return _refuse(decl, f"{reason}; runnable on the KV hand-off: {RUNNABLE_SHAPES}")


def _band_keep_fields(decl: KernelDeclaration) -> dict[str, Any]:
    n = decl.transform_length
    assert n is not None  # KernelDeclaration requires a length with a transform
    kept = n / decl.ratio
    whole = round(kept)
    if not math.isclose(kept, whole, rel_tol=_FLOAT_REL_TOL):
        lo, hi = max(1, math.floor(kept)), min(n - 1, math.ceil(kept))
        nearest = " or ".join(dict.fromkeys(f"{n / k:.4g} (keeps {k})" for k in (lo, hi) if 1 <= k <= n - 1))
        raise _refuse(decl, f"ratio {decl.ratio:g} contradicts the transform's kept fraction: it keeps "
                            f"{n}/{decl.ratio:g} = {kept:.4g} of {n} coefficients a block, and band-keep keeps a "
                            f"whole number (ratio N/k); nearest: {nearest}")
    if not 1 <= whole <= n - 1:
        what = "drops nothing (ratio 1 is codec none: transform none, no ops)" if whole == n else (
            "widens the block (band-keep only drops coefficients)" if whole > n else "keeps no coefficient")
        raise _refuse(decl, f"ratio {decl.ratio:g} keeps {whole} of {n} coefficients a block, which {what}; "
                            f"band-keep keeps 1..{n - 1} of {n}")
    if decl.lossless:
        raise _refuse(decl, "declared lossless, but band-keep drops coefficients (it is lossy)")
    return {"codec": "freq-keep-k", "variant": decl.transform, "block": n, "keep": whole / n}


def _preset_by_ratio(decl: KernelDeclaration) -> str:
    """The transform-less preset whose declared ratio (docs/reference.md §5) the declaration's ratio is."""
    if math.isclose(decl.ratio, 1.0, rel_tol=_FLOAT_REL_TOL):
        return "none"
    for name in ROUNDING_CODECS:
        if math.isclose(decl.ratio, CODECS[name].ratio, rel_tol=RATIO_MATCH_REL_TOL):
            return name
    raise _not_runnable(decl, f"transform none with ratio {decl.ratio:g} matches no implementation "
                              f"(fp8 is {CODECS['fp8'].ratio:g}, fp4-block {CODECS['fp4-block'].ratio:.4g}, "
                              f"kivi-3 {CODECS['kivi-3'].ratio:.4g}, kivi-2 {CODECS['kivi-2'].ratio:.4g}, none 1)")


def _transformless_fields(decl: KernelDeclaration) -> dict[str, Any]:
    codec = _preset_by_ratio(decl)
    if codec != "none" and decl.lossless:
        raise _refuse(decl, f"declared lossless, but {codec} rounds (it is lossy)")
    if codec == "fp4-block":
        return {"codec": codec, "block": LIVE_FP4_BLOCK}
    return {"codec": codec}


def _check_cost(decl: KernelDeclaration, impl: KernelDeclaration) -> None:
    """The declared op types and ops per byte against the implementation's (the rules in the module docstring)."""
    needed = impl.op_types - WIRING_OPS
    missing = needed - decl.op_types
    if missing:
        raise _refuse(decl, f"op_types {sorted(decl.op_types)} lack {', '.join(sorted(missing))}, which "
                            f"{impl.name} runs on (it declares {sorted(needed)}): declare every op it needs")
    if bool(decl.unpublished_ops) != bool(impl.unpublished_ops):
        unpublished = ", ".join(sorted(decl.unpublished_ops))
        raise _refuse(decl, f"op_types add {unpublished} (not published), which {impl.name} does not run: the "
                            f"module would refuse or send to the host a kernel that runs in it (an extra published "
                            f"op, e.g. mac, is accepted)")
    same = math.isclose(decl.ops_per_byte, impl.ops_per_byte, rel_tol=_FLOAT_REL_TOL, abs_tol=_FLOAT_ABS_TOL)
    if same:
        return
    if decl.ops_per_byte < impl.ops_per_byte:
        raise _refuse(decl, f"ops_per_byte {decl.ops_per_byte:g} is fewer than {impl.name} needs: "
                            f"{impl.ops_per_byte:g} ops/B besides the transform")
    if not impl.unpublished_ops:
        raise _refuse(decl, f"ops_per_byte {decl.ops_per_byte:g} is more than {impl.name} runs "
                            f"({impl.ops_per_byte:g} ops/B besides the transform), and in the module the run "
                            f"charges what runs: declare {impl.ops_per_byte:g}")


def scenario_fields_for(decl: KernelDeclaration) -> dict[str, Any]:
    """The scenario fields of the one implementation that runs `decl` (ConfigError naming why none does).

    Fields not returned (sinks, fp8's block, the module's budget and policy, the workload) stay as the scenario
    gives them.
    """
    if decl.streams > 1:
        raise _not_runnable(decl, f"it combines {decl.streams} streams (an in-network sum, the all-reduce's step): "
                                  f"{_OTHER_FLOWS}")
    if decl.transform == "ntt":
        raise _not_runnable(decl, f"an NTT (polynomial multiplication, as ML-KEM's): {_OTHER_FLOWS}")
    band_keep = decl.transform in BAND_KEEP_TRANSFORMS
    codec_fields = _band_keep_fields(decl) if band_keep else _transformless_fields(decl)
    fields = {**codec_fields, "compress_at": "transit", "transform_charged": decl.transform_charged,
              "precision_bits": decl.precision_bits, "placement": decl.placement}
    _check_cost(decl, Scenario.build(**fields).codec_declaration)
    return fields
