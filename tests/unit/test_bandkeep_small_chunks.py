"""Band-keep's small-chunk fast path gives the very bytes of the chunked path, encode and decode.

The middlebox encodes one-channel layers of ~8 KB (llama3-8b at scale 1/1024: [2, 2048, 1] BF16), where the
per-call Python work used to cost ~10× the FFT; `bandkeep` now runs an array that fits one chunk through a
plan built once per layout (benchmarks/RESULTS.md, "Band-keep on small chunks"). A plan must not change a
single bit: each case's payload and decoded array are pinned below as SHA-256 prefixes, computed with the
code before the fast path existed (commit 447f4de, scipy backend), and the fast path is also compared
byte for byte with the chunked path on every backend.

If a scipy upgrade changes pocketfft's rounding, the pinned hashes move while the two paths still agree:
regenerate them with `python tests/unit/test_bandkeep_small_chunks.py` on the code *before* your change.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor

import ml_dtypes
import numpy as np
import pytest

from kvtransit.kernels import bandkeep, get_codec
from kvtransit.kernels.fft_backends import available_backends

BF16, F16, F32 = ml_dtypes.bfloat16, np.float16, np.float32

# (shape, dtype, variant, keep, block, sinks, precision_bits): the study point first, then odd tails, a tail
# of one token, only a tail, no tail, sinks = the whole sequence, keep > 1/2 (mirrored bins), keep 1 (the
# Nyquist bin), an odd block, 4-D layouts, the precision noise, and arrays past one chunk (the chunked path).
CASES: dict[str, tuple[tuple[int, ...], type, str, float, int, int, int | None]] = {
    "layer-1ch-bf16-dct": ((2, 2048, 1), BF16, "dct", 0.5, 64, 4, None),
    "layer-1ch-bf16-fft": ((2, 2048, 1), BF16, "fft", 0.5, 64, 4, None),
    "layer-1ch-odd-tail": ((2, 2047, 1), BF16, "dct", 0.5, 64, 4, None),
    "layer-1ch-f16": ((2, 2048, 1), F16, "dct", 0.5, 64, 4, None),
    "layer-1ch-f32-fft": ((2, 2048, 1), F32, "fft", 0.5, 64, 4, None),
    "rows8-d4-tail36": ((8, 1000, 4), BF16, "dct", 0.5, 64, 4, None),
    "tail-of-one": ((2, 4 + 64 + 1, 3), BF16, "dct", 0.5, 64, 4, None),
    "tail-only": ((2, 4 + 10, 4), BF16, "fft", 0.5, 64, 4, None),
    "no-tail": ((2, 4 + 64, 4), F32, "dct", 0.5, 64, 4, None),
    "sinks-all": ((2, 4, 8), BF16, "dct", 0.5, 64, 4, None),
    "no-sinks-keep-3/4-dct": ((4, 300, 5), F32, "dct", 0.75, 64, 0, None),
    "no-sinks-keep-3/4-fft": ((4, 300, 5), F32, "fft", 0.75, 64, 0, None),
    "keep-1-fft-nyquist": ((4, 300, 5), BF16, "fft", 1.0, 64, 4, None),
    "keep-1-dct": ((4, 300, 5), F16, "dct", 1.0, 64, 4, None),
    "odd-block-dct": ((3, 4 + 7 * 9 + 5, 2), BF16, "dct", 0.5, 7, 4, None),
    "odd-block-fft": ((3, 4 + 7 * 9 + 5, 2), BF16, "fft", 0.5, 7, 4, None),
    "keep-1/4-block8-sinks2": ((2, 100, 8), BF16, "dct", 0.25, 8, 2, None),
    "4d-layer-f16": ((2, 3, 150, 16), F16, "fft", 0.5, 64, 4, None),
    "4d-layer-bf16": ((2, 8, 4 + 3 * 64 + 9, 16), BF16, "dct", 0.5, 64, 4, None),
    "precision-bits": ((2, 500, 8), BF16, "dct", 0.5, 64, 4, 8),
    "chunked-16-rows": ((16, 2048, 4), BF16, "dct", 0.5, 64, 4, None),
    "chunked-d128": ((1, 2048, 128), BF16, "dct", 0.5, 64, 4, None),
    "chunked-f32-fft": ((8, 2048, 8), F32, "fft", 0.5, 64, 4, None),
}

# SHA-256 prefixes of (payload bytes, decoded bytes), from the code before the fast path (see the docstring).
PINNED: dict[str, tuple[str, str]] = {
    "layer-1ch-bf16-dct": ("f7b712056fab1933", "389a00718e249223"),
    "layer-1ch-bf16-fft": ("96224d4ac10f4470", "3bf8e3de5b586a94"),
    "layer-1ch-odd-tail": ("4810400580199e9b", "6ae2415e13316474"),
    "layer-1ch-f16": ("d4eb5a7045294a39", "c166bbeab90c69fc"),
    "layer-1ch-f32-fft": ("0943f9e2cfc55964", "8fda9ee92515a212"),
    "rows8-d4-tail36": ("ad68932757867246", "ce8acf40798c9928"),
    "tail-of-one": ("a1cf98d470873130", "57699c0f54e72b22"),
    "tail-only": ("7cca3145984976be", "c102ee392c4ffe3c"),
    "no-tail": ("7646e8f12f4f3007", "d2b852508700692d"),
    "sinks-all": ("2592ddd52971d006", "2592ddd52971d006"),
    "no-sinks-keep-3/4-dct": ("42651c1bdeec253d", "fb0848c62a5d7417"),
    "no-sinks-keep-3/4-fft": ("f793c37c6e8433dd", "37d0f0b0e7c1903c"),
    "keep-1-fft-nyquist": ("9e0a967183967831", "71ad7e8c8477b84f"),
    "keep-1-dct": ("1fb9bc77a9deaacd", "e848c873d8535a57"),
    "odd-block-dct": ("b2f07e8df3f001d2", "b2195495d6aae906"),
    "odd-block-fft": ("472b5faf1895a1b8", "272ec3c6314b4240"),
    "keep-1/4-block8-sinks2": ("067146c47caef91a", "6ebd925af070deb0"),
    "4d-layer-f16": ("e2f0174337264f04", "a00e1e989f92807b"),
    "4d-layer-bf16": ("0b24fd9c0dd031b6", "979f0620af5b3d1d"),
    "precision-bits": ("00e4fc2314457396", "b84b6d0592599648"),
    "chunked-16-rows": ("716a2331c8047855", "8be678ebd8b2274b"),
    "chunked-d128": ("f9a174773774b297", "30c41ccb879792a6"),
    "chunked-f32-fft": ("2522731d5ab4b523", "9e43bc8f1e99736e"),
}


def case_input(shape: tuple[int, ...], dtype: type, seed: int = 1) -> np.ndarray:
    """Deterministic values everywhere: a 64-bit LCG in integers, mapped exactly to floats in [-2, 2)."""
    size = int(np.prod(shape))
    state = (np.arange(size, dtype=np.uint64) + np.uint64(seed)) * np.uint64(6364136223846793005)
    state += np.uint64(1442695040888963407)
    state ^= state >> np.uint64(29)
    state *= np.uint64(0xBF58476D1CE4E5B9)
    state ^= state >> np.uint64(32)
    values = (state >> np.uint64(40)).astype(np.int64) - (1 << 23)  # 24-bit integers, exact in float32
    return (values.astype(np.float32) * np.float32(2.0**-22)).reshape(shape).astype(dtype)


def _codec(name: str, backend: str = "scipy"):
    _shape, _dtype, variant, keep, block, sinks, bits = CASES[name]
    codec = get_codec("freq-keep-k", keep=keep, block=block, sinks=sinks, variant=variant, precision_bits=bits,
                      backend=backend, seed=3)
    return codec


def _run(name: str, backend: str = "scipy") -> tuple[np.ndarray, np.ndarray]:
    shape, dtype, *_ = CASES[name]
    codec = _codec(name, backend)
    enc = codec.encode(case_input(shape, dtype))
    return enc.payload, codec.decode(enc.header, enc.payload.tobytes())


def _digest(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:16]


@pytest.mark.parametrize("name", list(CASES))
def test_encode_and_decode_give_the_pinned_bytes(name):
    payload, decoded = _run(name)
    assert (_digest(payload), _digest(decoded)) == PINNED[name]


@pytest.mark.parametrize("backend", available_backends())
@pytest.mark.parametrize("name", list(CASES))
def test_the_fast_path_gives_the_chunked_paths_bytes(monkeypatch, name, backend):
    fast = _run(name, backend)
    monkeypatch.setattr(bandkeep, "SMALL_FAST_PATH", False)
    slow = _run(name, backend)
    for got, want in zip(fast, slow, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.tobytes() == want.tobytes()


def test_small_layers_of_many_shapes_in_threads_match_one_thread():
    """Each borrowed scratch set keeps its own plans' views: threads encoding and decoding different small
    layouts at once get the bytes one thread gets."""
    names = [n for n in CASES if not n.startswith("chunked")]

    def both(name):
        payload, decoded = _run(name)
        return payload.tobytes(), decoded.tobytes()

    serial = [both(n) for n in names]
    with ThreadPoolExecutor(max_workers=4) as pool:
        threaded = list(pool.map(both, names * 4))
    assert threaded == serial * 4


def test_the_plan_cache_does_not_keep_a_stale_chunk_size(monkeypatch):
    """A plan is keyed by CHUNK_BYTES too: shrinking it sends the same shape down the chunked path."""
    name = "layer-1ch-bf16-dct"
    before = _run(name)
    monkeypatch.setattr(bandkeep, "CHUNK_BYTES", 64 * 4)  # one block a chunk
    after = _run(name)
    np.testing.assert_allclose(after[0].astype(np.float32), before[0].astype(np.float32), atol=2e-2)


if __name__ == "__main__":  # print PINNED for the code as it stands
    print("PINNED = {")
    for case in CASES:
        p, d = _run(case)
        print(f'    "{case}": ("{_digest(p)}", "{_digest(d)}"),')
    print("}")
