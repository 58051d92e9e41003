"""Real CKKS ciphertexts of a small encrypted layer across an emulated link (flows/ciphertext/encrypted_layer.py)."""

from __future__ import annotations

import sys

import pytest

from kvtransit.flows.ciphertext.encrypted_layer import (
    ERROR_TOLERANCE,
    NOT_INSTALLED,
    NotInstalled,
    layer_dilation,
    load_tenseal,
    run_encrypted_layer,
)

pytestmark = pytest.mark.slow  # a CKKS context with Galois keys and three encrypted products: several seconds


async def test_encrypted_layer_round_trips_within_tolerance_and_its_transfer_share_is_measured():
    pytest.importorskip("tenseal", reason=NOT_INSTALLED)
    rate, latency = 100e6, 0.001  # 100 MB/s, 1 ms: the ciphertexts' link time is milliseconds
    report = await run_encrypted_layer(2, rate_Bps=rate, latency_s=latency)
    assert report.max_abs_error <= ERROR_TOLERANCE and report.within_tolerance
    # Real ciphertexts: N = 8192 with four primes serialise to hundreds of kB (not a 64-value plaintext's 512 B).
    assert report.input_ciphertext_bytes > 100_000 and report.output_ciphertext_bytes > 100_000
    assert report.context_bytes > report.input_ciphertext_bytes
    # The shaper never delivers early: each direction takes at least latency + bytes / rate.
    assert min(report.up_s) >= (latency + report.input_ciphertext_bytes / rate) * 0.999
    assert min(report.down_s) >= (latency + report.output_ciphertext_bytes / rate) * 0.999
    assert all(c > 0 for c in report.compute_s)
    assert 0 < report.transfer_share < 1
    for parts, whole in zip(zip(report.encrypt_s, report.up_s, report.compute_s, report.down_s, report.decrypt_s,
                                strict=True), report.request_s, strict=True):
        assert sum(parts) <= whole * 1.001  # the parts are disjoint intervals of the request


async def test_auto_dilation_holds_a_fast_links_ciphertexts_near_their_model():
    pytest.importorskip("tenseal", reason=NOT_INSTALLED)
    rate, latency = 3.125e9, 20e-6  # eth-25g: ~0.2 ms for the two ciphertexts, less than the host's cost of them
    dilation = await layer_dilation("auto", rate_Bps=rate, latency_s=latency)
    assert dilation.dilation > 1 and dilation.host_floor_s is not None
    report = await run_encrypted_layer(2, rate_Bps=rate, latency_s=latency, dilation=dilation)
    assert report.transfer_s_median == pytest.approx(report.modelled_transfer_s, rel=0.15)
    for parts, whole in zip(zip(report.encrypt_s, report.up_s, report.compute_s, report.down_s, report.decrypt_s,
                                strict=True), report.request_s, strict=True):
        assert sum(parts) <= whole * 1.001  # model seconds: still disjoint parts of the request


def test_without_tenseal_the_flow_says_not_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "tenseal", None)  # import of it now raises ImportError
    with pytest.raises(NotInstalled, match=r"not installed: pip install \.\[fhe\]"):
        load_tenseal()
