"""The ML-KEM-768 (FIPS 203) a handshake runs, chosen by name.

- "compiled" (the default): the `cryptography` package's ML-KEM, OpenSSL's C. Where a KEM's speed enters a verdict
  (the candidate table's link share is link time over link + compute) it is a compiled implementation's: about
  0.3 ms a handshake on this 2-core box (keygen + encaps + decaps), against kyber-py's 9.6 ms
  (benchmarks/RESULTS.md "Ciphertexts: which ML-KEM").
- "python": kyber-py, FIPS 203 written out in pure Python. Slow, but its arithmetic is open to read: the NTT check
  (ntt_check.py) compares the module's kernels with its polynomials, whichever KEM ran the handshakes.

Both take and give the standard encodings (a 1,184-byte encapsulation key, a 1,088-byte ciphertext, a 32-byte
secret), so either side of a handshake could be either. `reference_key_pair` gives the NTT check kyber-py's
expanded key pair for the key a handshake made: the compiled KEM's private key is its 64-byte seed (d ‖ z), which
kyber-py's `key_derive` expands by FIPS 203's own KeyGen_internal, and the encapsulation key it derives must be
byte for byte the one the compiled library made (a cross-check of the two implementations, `ReferencePair.agrees`).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata
from typing import Any, Protocol

KEMS = ("compiled", "python")
DEFAULT_KEM = "compiled"
INSTALL = "pip install .[pqkex]"


class NotInstalled(RuntimeError):
    """The flow's library is not installed; the message says which extra installs it."""


@dataclass(frozen=True)
class ReferencePair:
    """kyber-py's (ek, dk) for a handshake's key, and whether its ek is the one the handshake sent."""

    ek: bytes
    dk: bytes
    agrees: bool


class Kem(Protocol):
    name: str
    implementation: str  # what ran, with its version: the report says it

    def keygen(self) -> tuple[bytes, Any]:
        """(the encapsulation key's encoding, the decapsulation key as this implementation holds it)."""
        ...

    def encaps(self, ek: bytes) -> tuple[bytes, bytes]:
        """(the shared secret, the ciphertext)."""
        ...

    def decaps(self, dk: Any, ciphertext: bytes) -> bytes:
        ...

    def reference_key_pair(self, ek: bytes, dk: Any) -> ReferencePair | None:
        """kyber-py's expanded key pair for this key (None: kyber-py is not installed)."""
        ...


def _kyber() -> Any | None:
    try:
        from kyber_py.ml_kem import ML_KEM_768  # type: ignore[import-untyped, import-not-found, unused-ignore]
    except ImportError:
        return None
    return ML_KEM_768


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "unknown"


class CompiledKem:
    name = "compiled"

    def __init__(self) -> None:
        try:
            from cryptography.hazmat.primitives.asymmetric import mlkem
        except ImportError:
            raise NotInstalled(f"not installed: the compiled ML-KEM needs cryptography >= 48 ({INSTALL}); "
                               "--kem python runs kyber-py instead") from None
        self._mlkem = mlkem
        self.implementation = f"cryptography {_version('cryptography')} (OpenSSL)"

    def keygen(self) -> tuple[bytes, Any]:
        private = self._mlkem.MLKEM768PrivateKey.generate()
        return private.public_key().public_bytes_raw(), private

    def encaps(self, ek: bytes) -> tuple[bytes, bytes]:
        secret, ciphertext = self._mlkem.MLKEM768PublicKey.from_public_bytes(ek).encapsulate()
        return secret, ciphertext

    def decaps(self, dk: Any, ciphertext: bytes) -> bytes:
        return bytes(dk.decapsulate(ciphertext))

    def reference_key_pair(self, ek: bytes, dk: Any) -> ReferencePair | None:
        kyber = _kyber()
        if kyber is None:
            return None
        ref_ek, ref_dk = kyber.key_derive(dk.private_bytes_raw())  # the seed d ‖ z, FIPS 203 KeyGen_internal
        return ReferencePair(ref_ek, ref_dk, ref_ek == ek)


class PythonKem:
    name = "python"

    def __init__(self) -> None:
        kyber = _kyber()
        if kyber is None:
            raise NotInstalled(f"not installed: kyber-py ({INSTALL})")
        self._kem = kyber
        self.implementation = f"kyber-py {_version('kyber-py')} (pure Python)"

    def keygen(self) -> tuple[bytes, Any]:
        ek, dk = self._kem.keygen()
        return ek, dk

    def encaps(self, ek: bytes) -> tuple[bytes, bytes]:
        secret, ciphertext = self._kem.encaps(ek)
        return secret, ciphertext

    def decaps(self, dk: Any, ciphertext: bytes) -> bytes:
        return bytes(self._kem.decaps(dk, ciphertext))

    def reference_key_pair(self, ek: bytes, dk: Any) -> ReferencePair | None:
        return ReferencePair(ek, dk, True)


def load_kem(name: str = DEFAULT_KEM) -> Kem:
    """The KEM by name (KEMS); NotInstalled, saying what installs it, where its library is missing."""
    if name == "compiled":
        return CompiledKem()
    if name == "python":
        return PythonKem()
    raise ValueError(f"unknown KEM {name!r} (choose from: {', '.join(KEMS)})")


def reference_kem() -> Any | None:
    """kyber-py's ML_KEM_768, whose arithmetic the NTT check reads (None: not installed)."""
    return _kyber()
