"""Post-quantum key exchange as a flow (docs/reference.md §7): ML-KEM-768's bytes on the link and a handshake's model.

One session = the client's encapsulation key one way, the server's ciphertext back (FIPS 203: KeyGen at the
client, Encaps at the server, Decaps at the client), once per session. On a link of bandwidth B and latency L,
with `framing` bytes around each message, the link's share of one handshake is

    link_s = 2·L + (ek + framing) / B + (ct + framing) / B

and the handshake is that plus the three KEM operations' compute (measured, not modelled here).
Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvtransit.model.errors import ConfigError, require_positive

# FIPS 203 Table 2 / §8, ML-KEM-768: k = 3, d_u = 10, d_v = 4.
MLKEM768_K = 3
MLKEM768_DU = 10
MLKEM768_DV = 4
# FIPS 203 §7.1: ek = 384·k + 32 bytes (ByteEncode_12 of t̂, then ρ); docs/reference.md §7: 1,184 B.
MLKEM768_EK_BYTES = 384 * MLKEM768_K + 32
# FIPS 203 §7.2: c = 32·(d_u·k + d_v) bytes; docs/reference.md §7: 1,088 B.
MLKEM768_CT_BYTES = 32 * (MLKEM768_DU * MLKEM768_K + MLKEM768_DV)
# FIPS 203 §7.2: the shared secret is 32 bytes.
MLKEM_SHARED_SECRET_BYTES = 32


@dataclass(frozen=True)
class HandshakeModel:
    """The link's part of one ML-KEM-768 handshake (module docstring's formula)."""

    rate_Bps: float
    latency_s: float
    framing_bytes: int = 0

    def __post_init__(self) -> None:
        require_positive("handshake link rate_Bps", self.rate_Bps)
        if not self.latency_s >= 0:
            raise ConfigError(f"handshake link latency_s must be >= 0, got {self.latency_s!r}")
        if isinstance(self.framing_bytes, bool) or not isinstance(self.framing_bytes, int) or self.framing_bytes < 0:
            raise ConfigError(f"framing_bytes must be an integer >= 0, got {self.framing_bytes!r}")

    @property
    def bytes_client_to_server(self) -> int:
        return MLKEM768_EK_BYTES + self.framing_bytes

    @property
    def bytes_server_to_client(self) -> int:
        return MLKEM768_CT_BYTES + self.framing_bytes

    @property
    def link_s(self) -> float:
        """2·latency + both messages' serialisation: the least time a handshake spends on the link."""
        wire = self.bytes_client_to_server + self.bytes_server_to_client
        return 2 * self.latency_s + wire / self.rate_Bps

    def session_rate(self, compute_s: float) -> float:
        """Handshakes a second, one at a time on one connection, given the KEM operations' compute per session."""
        if not compute_s >= 0:
            raise ConfigError(f"compute_s must be >= 0, got {compute_s!r}")
        return 1.0 / (self.link_s + compute_s)
