"""Post-quantum key exchange over an emulated link (docs/reference.md §7): ML-KEM-768 handshakes between a
client and a server on loopback TCP, each message held by the link's shaper, shared secrets compared, and the
module's NTT kernel (kernels/ntt.py) checked against the library's own arithmetic on the keys that crossed.

The KEM is kyber-py (FIPS 203), never home-made; without it the flow says "not installed".
"""
