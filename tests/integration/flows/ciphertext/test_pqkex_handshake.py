"""ML-KEM-768 handshakes across an emulated link over loopback TCP (flows/ciphertext/handshake.py), by the compiled
KEM and by kyber-py (flows/ciphertext/kem.py)."""

from __future__ import annotations

import sys

import pytest

from kvtransit.flows.ciphertext.handshake import NotInstalled, handshake_dilation, run_handshakes
from kvtransit.flows.ciphertext.kem import INSTALL, KEMS, load_kem
from kvtransit.flows.ciphertext.model import MLKEM768_CT_BYTES, MLKEM768_EK_BYTES, HandshakeModel
from kvtransit.flows.ciphertext.serial_dilation import SerialDilation

HEADER = 5
NOT_INSTALLED = f"not installed: {INSTALL}"


@pytest.mark.parametrize("kem", KEMS)
async def test_handshakes_round_trip_with_equal_secrets_and_the_ntt_checked_against_the_library(kem):
    pytest.importorskip("kyber_py.ml_kem", reason=NOT_INSTALLED)
    pytest.importorskip("cryptography.hazmat.primitives.asymmetric.mlkem", reason=NOT_INSTALLED)
    # A slow link (1 MB/s, 2 ms) so the link's part is milliseconds, well above timer resolution.
    report = await run_handshakes(4, rate_Bps=1e6, latency_s=0.002, kem=kem)
    assert report.all_secrets_equal and report.secrets_equal == 4
    assert report.kem == kem and report.reference_agrees is True  # kyber-py derives the key that crossed the link
    assert report.bytes_client_to_server == 4 * (MLKEM768_EK_BYTES + HEADER)
    assert report.bytes_server_to_client == 4 * (MLKEM768_CT_BYTES + HEADER)
    assert report.ntt_check is not None and report.ntt_check.ok
    modelled = HandshakeModel(1e6, 0.002, framing_bytes=HEADER).link_s
    assert report.modelled_link_s == pytest.approx(modelled)
    # The shaper never delivers early: each session's link time is at least the model's.
    assert min(report.link_s_per_session) >= modelled * 0.999
    assert report.session_rate > 0


async def test_at_a_dilation_the_link_runs_slower_and_its_times_are_given_in_model_seconds():
    pytest.importorskip("kyber_py.ml_kem", reason=NOT_INSTALLED)
    rate, latency = 1e6, 0.002
    report = await run_handshakes(3, rate_Bps=rate, latency_s=latency, check_ntt=False,
                                  dilation=SerialDilation(4.0, "asked for"))
    modelled = HandshakeModel(rate, latency, framing_bytes=HEADER).link_s
    assert report.all_secrets_equal and report.dilation.dilation == 4.0
    # Held 4x longer on the wall, divided by 4: never below the model, and nowhere near 4x it.
    assert min(report.link_s_per_session) >= modelled * 0.999
    assert report.link_s_median < modelled * 1.5


async def test_auto_dilation_holds_a_fast_links_handshake_near_its_model():
    pytest.importorskip("kyber_py.ml_kem", reason=NOT_INSTALLED)
    rate, latency = 3.125e9, 20e-6  # eth-25g (docs/reference.md §2): a 41 µs link time, of the order of the host's cost
    dilation = await handshake_dilation("auto", rate_Bps=rate, latency_s=latency)
    assert dilation.dilation > 1 and dilation.host_floor_s is not None and dilation.host_floor_s > 0
    report = await run_handshakes(10, rate_Bps=rate, latency_s=latency, check_ntt=False, dilation=dilation)
    # Undilated the median read +156 % here; a noisy 2-core box gets a wide band, not the candidate table's 5 %.
    assert report.link_s_median == pytest.approx(report.modelled_link_s, rel=0.15)


def test_without_kyber_py_the_python_kem_says_not_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "kyber_py.ml_kem", None)  # import of it now raises ImportError
    with pytest.raises(NotInstalled, match=r"not installed: kyber-py \(pip install \.\[pqkex\]\)"):
        load_kem("python")


def test_without_a_compiled_ml_kem_the_flow_says_what_installs_it_and_what_runs_instead(monkeypatch):
    asymmetric = pytest.importorskip("cryptography.hazmat.primitives.asymmetric")
    monkeypatch.setitem(sys.modules, "cryptography.hazmat.primitives.asymmetric.mlkem", None)
    monkeypatch.delattr(asymmetric, "mlkem", raising=False)  # a from-import finds the attribute first
    with pytest.raises(NotInstalled, match=r"cryptography >= 48 \(pip install \.\[pqkex\]\); --kem python"):
        load_kem("compiled")
