"""The timings every group of rank processes shares (TP/EP groups, ring attention, selection's and weight
streaming's roles): how long a rank waits for a peer, for its leader to dial it, and how its clock spins.

Every process of a group is on one host, so the monotonic clock the orders' times are on is shared.
"""

from __future__ import annotations

# The clock's yield-spin before each deadline. A rank holds a short wait at every hop (a modelled hop at the
# dilations that carry per-layer messages is ~0.5 ms), so the agents' 500 µs spin (runtime/clock.py) would
# spin through nearly every wait, n ranks on 2 cores. Measured (llama3-70b TP4 ring, per layer, dilation 100,
# 4 rank processes on the 2-core dev box): 500 µs spin, step 20 % over the model; 50 µs spin, 4.4 % over.
RANK_SPIN_S = 50e-6
# How long a rank waits for a peer inside a collective before the step fails with a reason (not a hang); the
# collective's own frames are due within milliseconds, so this bounds only a dead or stuck peer.
COLLECTIVE_DEADLINE_S = 10.0
# How long a follower waits for its leader to dial it: the launcher starts the leader right after its followers
# (a cold start imports numpy and the rest: seconds on a busy box; the launcher's readiness timeout is 60 s).
LEADER_DIAL_S = 120.0
