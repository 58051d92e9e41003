"""ML-KEM-768's bytes and handshake model (flows/ciphertext/model.py), FIPS 203's ByteEncode/Decode_12
(kernels/mlkem_encoding.py), and the NTT kernel checked against kyber-py's arithmetic on real keys
(flows/ciphertext/ntt_check.py)."""

from __future__ import annotations

import pytest

from kvtransit.flows.ciphertext.model import MLKEM768_CT_BYTES, MLKEM768_EK_BYTES, HandshakeModel
from kvtransit.kernels.errors import KernelInputError
from kvtransit.kernels.mlkem_encoding import byte_decode_12, byte_encode_12
from kvtransit.model.errors import ConfigError


def test_mlkem768_sizes_are_reference_1184_and_1088_bytes():
    assert (MLKEM768_EK_BYTES, MLKEM768_CT_BYTES) == (1184, 1088)


def test_handshake_link_time_is_two_latencies_plus_both_messages_over_the_rate():
    # 2 × 2 ms + (1184 + 5 + 1088 + 5) B / 1 MB/s = 4 ms + 2.282 ms.
    model = HandshakeModel(rate_Bps=1e6, latency_s=0.002, framing_bytes=5)
    assert model.link_s == pytest.approx(0.006282)
    assert model.session_rate(compute_s=0.003718) == pytest.approx(100.0)
    with pytest.raises(ConfigError, match="latency_s must be >= 0"):
        HandshakeModel(rate_Bps=1e6, latency_s=-1)


def test_byte_decode_12_unpacks_two_coefficients_from_three_bytes_little_endian():
    # 0x01 0x23 0x45: a0 = 0x01 | (0x3 << 8) = 769, a1 = 0x2 | (0x45 << 4) = 1106 (FIPS 203 Algorithm 6).
    data = bytes([0x01, 0x23, 0x45]) + bytes(381)
    polys = byte_decode_12(data)
    assert polys.shape == (1, 256)
    assert polys[0, :3].tolist() == [769, 1106, 0]
    assert byte_encode_12(polys) == data
    with pytest.raises(KernelInputError, match="whole number of 384-byte polynomials, got 383"):
        byte_decode_12(bytes(383))


def _kem_and_keys():
    ml_kem = pytest.importorskip("kyber_py.ml_kem", reason="not installed: pip install .[pqkex]")
    kem = ml_kem.ML_KEM_768
    ek, dk = kem.key_derive(bytes(range(64)))  # FIPS 203 KeyGen from a fixed (d, z): the same keys every run
    return kem, ek, dk


def test_ntt_kernel_matches_kyber_py_on_a_real_key_pair():
    from kvtransit.flows.ciphertext.ntt_check import check_against_library

    kem, ek, dk = _kem_and_keys()
    assert len(ek) == MLKEM768_EK_BYTES
    check = check_against_library(kem, ek, dk)
    assert check.mismatches == {"decode": 0, "intt": 0, "ntt": 0, "multiply_ntts": 0}
    assert check.error_max_abs <= check.error_bound == 2
    assert check.ok


def test_ntt_check_fails_on_a_key_whose_polynomials_do_not_belong_together():
    from kvtransit.flows.ciphertext.ntt_check import check_against_library

    kem, ek, dk = _kem_and_keys()
    polys = byte_decode_12(dk[:1152])
    polys[0, 5] = (polys[0, 5] + 1) % 3329  # ŝ one off in one NTT-domain coefficient
    check = check_against_library(kem, ek, byte_encode_12(polys) + dk[1152:])
    assert check.error_max_abs > check.error_bound
    assert not check.ok


async def test_a_message_of_the_wrong_size_is_refused_in_one_line():
    import asyncio

    from kvtransit.flows.ciphertext.message_framing import MessageError, frame, read_message

    reader = asyncio.StreamReader()
    reader.feed_data(frame(1, bytes(1183)))
    with pytest.raises(MessageError, match="server: message kind 1 of 1183 bytes, expected 1184"):
        await read_message(reader, {1: 1184}, "server")
    reader = asyncio.StreamReader()
    reader.feed_data(frame(1, bytes(10))[:8])
    reader.feed_eof()
    with pytest.raises(MessageError, match="closed after 3 of 10 payload bytes"):
        await read_message(reader, {1: None}, "client")
