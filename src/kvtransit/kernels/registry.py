"""Codecs by name: the middlebox's one entry point (`get_codec`), and `decode` from a header alone.

    codec = get_codec("freq-keep-k", keep=0.5, block=64, sinks=4, variant="dct")
    enc = codec.encode(kv)                      # kv [..., tokens, head_dim], bfloat16 / float16 / float32
    kv2 = codec.decode(enc.header, enc.payload.tobytes())   # or any buffer of the payload bytes

Input checks (all raise KernelInputError, a ValueError): fewer than 2 dims, an unsupported dtype, block
< 2, keep outside (0, 1], sinks larger than the sequence, and NaN/Inf anywhere in the input, reported
with their count and the index of the first. Non-finite values are detected where they must surface (the
payload: a NaN or Inf in a block reaches its always-kept mean coefficient) and only then located in the
input, so a clean frame pays for one pass over the payload, not over the input.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

import numpy as np

from kvtransit.kernels import bandkeep, kivi, quant
from kvtransit.kernels.errors import KernelInputError
from kvtransit.kernels.fft_backends import BACKEND_NAMES, get_backend
from kvtransit.kernels.header import Header, wire_dtype_name
from kvtransit.model.catalog.codecs import codec_declaration
from kvtransit.model.errors import ConfigError, unknown_name
from kvtransit.model.module.budget import KernelDeclaration

CODEC_NAMES: tuple[str, ...] = ("none", "fp8", "fp4-block", "freq-keep-k", "kivi-2", "kivi-3")


@dataclass(frozen=True)
class Encoded:
    """What crosses the wire: a small self-describing header and one C-contiguous payload array."""

    header: bytes
    payload: np.ndarray

    @property
    def wire_bytes(self) -> int:
        return self.payload.nbytes


def _check_input(kv: np.ndarray) -> str:
    if not isinstance(kv, np.ndarray):
        raise KernelInputError(f"KV must be a numpy array, got {type(kv).__name__}")
    if kv.ndim < 2:
        raise KernelInputError(f"KV must be [..., tokens, head_dim] (>= 2 dims), got shape {kv.shape}")
    return wire_dtype_name(kv.dtype)


def _non_finite_error(kv: np.ndarray, where: str) -> KernelInputError:
    bad = ~np.isfinite(kv.astype(np.float32, copy=False))
    count = int(bad.sum())
    if count == 0:  # finite input whose coefficients overflowed the wire dtype
        return KernelInputError(f"{where}: coefficients overflow {kv.dtype} (input is finite; max |x| = "
                                f"{float(np.abs(kv.astype(np.float32)).max()):.3g})")
    first = tuple(int(i) for i in np.unravel_index(int(bad.argmax()), kv.shape))
    return KernelInputError(f"{where}: input has {count} NaN/Inf value(s), first at index {first} of shape {kv.shape}")


# What a codec decodes: the payload bytes as received (a view of the receive buffer) or as encoded.
Payload = bytes | bytearray | memoryview | np.ndarray


def _payload_bytes(payload: Payload, expected: int, codec: str) -> np.ndarray:
    buf = (payload.reshape(-1).view(np.uint8) if isinstance(payload, np.ndarray)
           else np.frombuffer(payload, np.uint8))
    if buf.size != expected:
        raise KernelInputError(f"{codec} payload: {buf.size} bytes, header implies {expected}")
    return buf


@lru_cache(maxsize=1024)
def _unpack_header(data: bytes) -> Header:
    """Header.unpack, remembered: a stream's chunks repeat a few headers (one per layer shape), and a small
    chunk's decode is otherwise mostly this parsing. (Headers are frozen; a bad one raises and is not kept.)"""
    return Header.unpack(data)


class Codec:
    """A named kernel: encode/decode on KV arrays, and its declaration for the module's budget check."""

    name: str

    @property
    def params(self) -> dict[str, Any]:
        raise NotImplementedError

    @property
    def declaration(self) -> KernelDeclaration:
        raise NotImplementedError

    def encode(self, kv: np.ndarray) -> Encoded:
        raise NotImplementedError

    def decode(self, header: bytes, payload: Payload) -> np.ndarray:
        h = _unpack_header(bytes(header))
        if h.codec != self.name:
            raise KernelInputError(f"header is for codec {h.codec!r}, this codec is {self.name!r}")
        return self._decode(h, payload)

    def _decode(self, h: Header, payload: Payload) -> np.ndarray:
        raise NotImplementedError


class NoneCodec(Codec):
    name = "none"

    @property
    def params(self) -> dict[str, Any]:
        return {}

    @property
    def declaration(self) -> KernelDeclaration:
        return codec_declaration("none")

    def encode(self, kv: np.ndarray) -> Encoded:
        dtype = _check_input(kv)
        if not bandkeep.all_finite(kv):
            raise _non_finite_error(kv, "none")
        return Encoded(Header("none", dtype, kv.shape, ()).pack(), np.ascontiguousarray(kv))

    def _decode(self, h: Header, payload: Payload) -> np.ndarray:
        size = int(np.prod(h.shape))
        buf = _payload_bytes(payload, size * h.np_dtype.itemsize, "none")
        return buf.view(h.np_dtype).reshape(h.shape).copy()


class Fp8Codec(Codec):
    name = "fp8"

    def __init__(self, block: int = quant.DEFAULT_FP8_BLOCK) -> None:
        if block < 1:
            raise KernelInputError(f"fp8: block must be >= 1 value per scale, got {block}")
        self.block = block

    @property
    def params(self) -> dict[str, Any]:
        return {"block": self.block}

    @property
    def declaration(self) -> KernelDeclaration:
        return codec_declaration("fp8")

    def encode(self, kv: np.ndarray) -> Encoded:
        dtype = _check_input(kv)
        with np.errstate(invalid="ignore"):  # a NaN/Inf block is reported just below, by name
            payload = quant.fp8_encode(kv, self.block)
        scales = payload[kv.size :].view(np.float32)
        if not np.isfinite(scales).all():  # a NaN/Inf in a block reaches its amax, hence its scale
            raise _non_finite_error(kv, "fp8")
        return Encoded(Header("fp8", dtype, kv.shape, (self.block,)).pack(), payload)

    def _decode(self, h: Header, payload: Payload) -> np.ndarray:
        size = int(np.prod(h.shape))
        (block,) = h.params
        if block < 1:
            raise KernelInputError(f"fp8 header: block {block} < 1")
        buf = _payload_bytes(payload, quant.fp8_payload_bytes(size, block), "fp8")
        return quant.fp8_decode(buf, size, block).reshape(h.shape).astype(h.np_dtype)


class Fp4BlockCodec(Codec):
    name = "fp4-block"

    @property
    def params(self) -> dict[str, Any]:
        return {"block": quant.FP4_BLOCK}

    @property
    def declaration(self) -> KernelDeclaration:
        return codec_declaration("fp4-block", block=quant.FP4_BLOCK)

    def encode(self, kv: np.ndarray) -> Encoded:
        dtype = _check_input(kv)
        amax = np.abs(quant._blocks(kv, quant.FP4_BLOCK)).max(axis=1)
        if not np.isfinite(amax).all():
            raise _non_finite_error(kv, "fp4-block")
        return Encoded(Header("fp4-block", dtype, kv.shape, (quant.FP4_BLOCK,)).pack(), quant.fp4_encode(kv))

    def _decode(self, h: Header, payload: Payload) -> np.ndarray:
        size = int(np.prod(h.shape))
        if h.params != (quant.FP4_BLOCK,):
            raise KernelInputError(f"fp4-block header: block {h.params[0]}, only {quant.FP4_BLOCK} is defined")
        buf = _payload_bytes(payload, quant.fp4_payload_bytes(size), "fp4-block")
        return quant.fp4_decode(buf, size).reshape(h.shape).astype(h.np_dtype)


class KiviCodec(Codec):
    """KIVI-style asymmetric 2- or 3-bit codes: keys per channel, values per token (`kivi.py`)."""

    def __init__(self, bits: int, group: int = kivi.KIVI_GROUP) -> None:
        if bits not in kivi.KIVI_BITS:
            raise KernelInputError(f"kivi: bits must be one of {kivi.KIVI_BITS}, got {bits}")
        if group < 1:
            raise KernelInputError(f"kivi-{bits}: group must be >= 1 value, got {group}")
        self.name = f"kivi-{bits}"
        self.bits, self.group = bits, group

    @property
    def params(self) -> dict[str, Any]:
        return {"bits": self.bits, "group": self.group}

    @property
    def declaration(self) -> KernelDeclaration:
        return codec_declaration(self.name)

    def encode(self, kv: np.ndarray) -> Encoded:
        dtype = _check_input(kv)
        payload = kivi.encode(kv, self.bits, self.group)
        steps, zeros = kivi.group_params(payload, kivi.KiviLayout(kv.shape, self.group), self.bits)
        if not (np.isfinite(steps).all() and np.isfinite(zeros).all()):  # NaN/Inf reach a group's min or max
            if bandkeep.all_finite(kv):
                raise KernelInputError(f"{self.name}: a group's range exceeds float16's (max |x| = "
                                       f"{float(np.abs(kv.astype(np.float32)).max()):.3g}; float16 max 65504)")
            raise _non_finite_error(kv, self.name)
        return Encoded(Header(self.name, dtype, kv.shape, (self.bits, self.group)).pack(), payload)

    def _decode(self, h: Header, payload: Payload) -> np.ndarray:
        bits, group = h.params
        if bits != self.bits:
            raise KernelInputError(f"{h.codec} header: bits {bits}, the codec's name says {self.bits}")
        if group < 1:
            raise KernelInputError(f"{h.codec} header: group {group} < 1")
        layout = kivi.KiviLayout(h.shape, group)
        buf = _payload_bytes(payload, layout.payload_bytes(bits), h.codec)
        return kivi.decode(buf, h.shape, bits, group).astype(h.np_dtype)


class BandKeepCodec(Codec):
    name = "freq-keep-k"

    def __init__(self, keep: float, block: int, sinks: int, variant: str, precision_bits: int | None,
                 backend: str, seed: int) -> None:
        if not 0 < keep <= 1:  # also rejects NaN
            raise KernelInputError(f"freq-keep-k: keep must be in (0, 1], got {keep!r}")
        if block < 2:
            raise KernelInputError(f"freq-keep-k: block must be >= 2 tokens, got {block}")
        if sinks < 0:
            raise KernelInputError(f"freq-keep-k: sinks must be >= 0, got {sinks}")
        if variant not in bandkeep.VARIANTS:
            raise KernelInputError(str(unknown_name("band-keep variant", variant, bandkeep.VARIANTS)))
        if precision_bits is not None and not 1 <= precision_bits <= 32:
            raise KernelInputError(f"freq-keep-k: precision_bits must be in 1..32 or None, got {precision_bits}")
        self.keep, self.block, self.sinks, self.variant = keep, block, sinks, variant
        self.precision_bits, self.seed = precision_bits, seed
        self.backend_name = backend
        self.backend = get_backend(backend)
        # (shape, wire dtype) → (layout, packed header): the same few per stream, and rebuilding them cost a
        # small chunk's encode as much as its FFT. Threads share the codec: a dict get/set is atomic, and two
        # threads missing at once only build the same entry twice.
        self._encode_layouts: dict[tuple[tuple[int, ...], str], tuple[bandkeep.BandKeepLayout, bytes]] = {}

    @property
    def params(self) -> dict[str, Any]:
        return {"keep": self.keep, "block": self.block, "sinks": self.sinks, "variant": self.variant,
                "precision_bits": self.precision_bits, "backend": self.backend.name, "seed": self.seed}

    @property
    def declaration(self) -> KernelDeclaration:
        decl = codec_declaration("freq-keep-k", keep=self.keep, transform_length=self.block)
        return replace(decl, precision_bits=self.precision_bits)

    def encode(self, kv: np.ndarray) -> Encoded:
        dtype = _check_input(kv)
        key = (kv.shape, dtype)
        known = self._encode_layouts.get(key)
        if known is None:
            known = self._layout_and_header(kv.shape, dtype)
            if len(self._encode_layouts) >= _MAX_LAYOUTS:
                self._encode_layouts.clear()
            self._encode_layouts[key] = known
        layout, header = known
        with np.errstate(invalid="ignore", over="ignore"):  # NaN/Inf/overflow is reported just below
            payload = bandkeep.encode(kv, layout, self.backend, self.precision_bits, self.seed)
        if not bandkeep.all_finite(payload):
            raise _non_finite_error(kv, "freq-keep-k")
        return Encoded(header, payload)

    def _layout_and_header(self, shape: tuple[int, ...], dtype: str) -> tuple[bandkeep.BandKeepLayout, bytes]:
        layout = bandkeep.layout_for(shape, self.keep, self.block, self.sinks, self.variant)
        header = Header("freq-keep-k", dtype, shape, (
            layout.block, layout.sinks, layout.kept_block, layout.kept_tail,
            bandkeep.VARIANTS.index(layout.variant), self.precision_bits or 0))
        return layout, header.pack()

    def _decode(self, h: Header, payload: Payload) -> np.ndarray:
        layout = _band_keep_layout(h)
        size = math.prod(layout.payload_shape)
        buf = _payload_bytes(payload, size * h.np_dtype.itemsize, "freq-keep-k")
        return bandkeep.decode(buf.view(h.np_dtype).reshape(layout.payload_shape), layout, self.backend)


_MAX_LAYOUTS = 1024  # remembered (shape, dtype)s per band-keep codec: prompts of that many lengths


@lru_cache(maxsize=1024)
def _band_keep_layout(h: Header) -> bandkeep.BandKeepLayout:
    """The layout a freq-keep-k header describes, checked (remembered: a stream repeats its headers)."""
    block, sinks, kept_block, kept_tail, variant_id, _bits = h.params
    if variant_id >= len(bandkeep.VARIANTS):
        raise KernelInputError(f"freq-keep-k header: unknown variant id {variant_id}")
    layout = bandkeep.BandKeepLayout(h.shape, block, sinks, kept_block, kept_tail, bandkeep.VARIANTS[variant_id])
    layout.check()
    return layout


def get_codec(name: str, keep: float = bandkeep.DEFAULT_KEEP, block: int | None = None,
              sinks: int = bandkeep.DEFAULT_SINKS, variant: str = "dct", precision_bits: int | None = None,
              backend: str = "auto", seed: int = 0) -> Codec:
    """The codec called `name` (one of CODEC_NAMES).

    `block` is per codec: tokens per transform for freq-keep-k (default 64), values per scale for fp8
    (default 64); fp4-block's block is fixed at 32 (MXFP4) and any other value is an error. kivi-2/kivi-3
    ignore it: their group is KIVI's 32 values, the one their declared ratio assumes (the middlebox passes the
    scenario's block, band-keep's transform length, to every codec). keep, sinks, variant, precision_bits,
    backend and seed apply to freq-keep-k only.
    """
    if name == "none":
        return NoneCodec()
    if name == "fp8":
        return Fp8Codec(quant.DEFAULT_FP8_BLOCK if block is None else block)
    if name == "fp4-block":
        if block not in (None, quant.FP4_BLOCK):
            raise KernelInputError(f"fp4-block: block is fixed at {quant.FP4_BLOCK} values, got {block}")
        return Fp4BlockCodec()
    if name in ("kivi-2", "kivi-3"):
        return KiviCodec(int(name[-1]))
    if name == "freq-keep-k":
        if backend not in BACKEND_NAMES:
            raise KernelInputError(str(unknown_name("FFT backend", backend, BACKEND_NAMES)))
        return BandKeepCodec(keep, bandkeep.DEFAULT_BLOCK if block is None else block, sinks, variant,
                             precision_bits, backend, seed)
    raise KernelInputError(str(unknown_name("codec", name, CODEC_NAMES)))


@lru_cache(maxsize=64)
def _band_keep_decoder(block: int) -> Codec:
    """The freq-keep-k codec `decode` inverts with (one per block size, not one per call: its decode reads only
    the header's fields, so a shared one is safe in threads)."""
    return get_codec("freq-keep-k", block=block)


def scenario_codec(scenario: Any, tokens: int | None = None) -> Codec | None:
    """The codec a scenario (model/scenario.py: `Scenario`) names, with its parameters (None for "none"): what the
    prefill encodes with at the GPU and the twin sizes the wire by (twin/link.py). A prompt shorter than the sink
    count keeps every token exact (sinks capped at the prompt length)."""
    if scenario.codec == "none":
        return None
    if scenario.codec == "freq-keep-k":
        sinks = scenario.sinks if tokens is None else min(scenario.sinks, tokens)
        return get_codec("freq-keep-k", keep=scenario.keep, block=scenario.block, sinks=sinks, variant=scenario.variant)
    if scenario.codec == "fp8":
        return get_codec("fp8", block=scenario.block)
    return get_codec(scenario.codec)  # fp4-block: its block is fixed by the format


def decode(header: bytes, payload: Payload) -> np.ndarray:
    """Invert any codec from its header and payload bytes alone (FFT backend: auto)."""
    h = _unpack_header(bytes(header))
    if h.codec == "freq-keep-k":
        codec = _band_keep_decoder(h.params[0])
    elif h.codec in ("kivi-2", "kivi-3"):
        _bits, group = h.params  # bits are checked against the name by _decode
        if group < 1:
            raise KernelInputError(f"{h.codec} header: group {group} < 1")
        codec = KiviCodec(int(h.codec[-1]), group)  # the header's group, whatever the live default
    else:
        codec = get_codec(h.codec)
    return codec._decode(h, payload)


__all__ = ["CODEC_NAMES", "Codec", "ConfigError", "Encoded", "decode", "get_codec", "scenario_codec"]
