"""Request classes: which requests of a run belong to a flow's class (the remote-KV class, the ring class), as a pure
function of the run's seed and the request id, so the load generator, the agents and the report agree without telling
each other.

Pure: stdlib only.
"""

from __future__ import annotations

_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    """Sebastiano Vigna's SplitMix64 finaliser: a fixed, well-mixed hash of a 64-bit integer."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def in_class(seed: int, request_id: int, share: float, salt: int = 0) -> bool:
    """Whether request `request_id` of a run seeded `seed` is in a request class of `share` of the ids; `salt` keeps
    one class's draw apart from another's (0: the remote-KV class's)."""
    if share >= 1:
        return True
    return _splitmix64(((seed & _MASK64) * 0x100000001B3 ^ request_id) ^ salt) / 2.0**64 < share
