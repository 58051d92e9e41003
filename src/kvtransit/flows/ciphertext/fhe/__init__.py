"""FHE inference over an emulated link (docs/reference.md §7): real CKKS ciphertexts (TenSEAL, the `fhe`
extra) of a small encrypted layer cross a shaped loopback link; the encrypted compute is timed on this CPU and the
transfer's share of the request's time measured. Without TenSEAL the flow says "not installed", never fakes it.
"""
