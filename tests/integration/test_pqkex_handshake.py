"""ML-KEM-768 handshakes across an emulated link over loopback TCP (agents/pqkex/handshake.py)."""

from __future__ import annotations

import sys

import pytest

from kvtransit.agents.pqkex.handshake import NOT_INSTALLED, NotInstalled, load_kem, run_handshakes
from kvtransit.model.pqkex import MLKEM768_CT_BYTES, MLKEM768_EK_BYTES, HandshakeModel

HEADER = 5


async def test_handshakes_round_trip_with_equal_secrets_and_the_ntt_checked_against_the_library():
    pytest.importorskip("kyber_py.ml_kem", reason=NOT_INSTALLED)
    # A slow link (1 MB/s, 2 ms) so the link's part is milliseconds, well above timer resolution.
    report = await run_handshakes(4, rate_Bps=1e6, latency_s=0.002)
    assert report.all_secrets_equal and report.secrets_equal == 4
    assert report.bytes_client_to_server == 4 * (MLKEM768_EK_BYTES + HEADER)
    assert report.bytes_server_to_client == 4 * (MLKEM768_CT_BYTES + HEADER)
    assert report.ntt_check is not None and report.ntt_check.ok
    modelled = HandshakeModel(1e6, 0.002, framing_bytes=HEADER).link_s
    assert report.modelled_link_s == pytest.approx(modelled)
    # The shaper never delivers early: each session's link time is at least the model's.
    assert min(report.link_s_per_session) >= modelled * 0.999
    assert report.session_rate > 0


def test_without_kyber_py_the_flow_says_not_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "kyber_py.ml_kem", None)  # import of it now raises ImportError
    with pytest.raises(NotInstalled, match=r"not installed: pip install \.\[pqkex\]"):
        load_kem()
