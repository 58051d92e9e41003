"""The handshake's ML-KEM-768 chosen by name (flows/ciphertext/kem.py): the compiled one and kyber-py speak the same
encodings, so a key from one is encapsulated by the other and decapsulated back to the same secret, and kyber-py
expands the compiled key's seed into the very encapsulation key the compiled library made."""

from __future__ import annotations

import pytest

from kvtransit.flows.ciphertext.kem import KEMS, load_kem
from kvtransit.flows.ciphertext.model import MLKEM768_CT_BYTES, MLKEM768_EK_BYTES

pytest.importorskip("kyber_py.ml_kem", reason="not installed: pip install .[pqkex]")
pytest.importorskip("cryptography.hazmat.primitives.asymmetric.mlkem", reason="not installed: pip install .[pqkex]")


@pytest.mark.parametrize("holder,other", [("compiled", "python"), ("python", "compiled")])
def test_a_key_from_one_kem_is_encapsulated_by_the_other_to_the_same_secret(holder, other):
    keys, peer = load_kem(holder), load_kem(other)
    ek, dk = keys.keygen()
    secret, ciphertext = peer.encaps(ek)
    assert (len(ek), len(ciphertext), len(secret)) == (MLKEM768_EK_BYTES, MLKEM768_CT_BYTES, 32)
    assert keys.decaps(dk, ciphertext) == secret


def test_kyber_py_expands_the_compiled_keys_seed_into_the_same_encapsulation_key():
    kem = load_kem("compiled")
    ek, dk = kem.keygen()
    pair = kem.reference_key_pair(ek, dk)
    assert pair is not None and pair.agrees and pair.ek == ek and len(pair.dk) == 2400  # FIPS 203: 768·k + 96
    assert "OpenSSL" in kem.implementation and "pure Python" in load_kem("python").implementation


def test_an_unknown_kem_is_named_with_the_choices():
    with pytest.raises(ValueError, match=r"unknown KEM 'rust' \(choose from: compiled, python\)"):
        load_kem("rust")
    assert KEMS == ("compiled", "python")
