"""What this host carries of a flow's rank processes, measured here: how many a core, and what one hop costs.

The run-to-end flows (`kvtransit collective`, `ring`, `select`, `weights`) and `kvtransit up`'s TP groups and rings
start rank processes beside the run's own; these bound how many, and their runs choose a dilation at which a
modelled hop is not shorter than the host's own cost of one.
"""

from __future__ import annotations

# What one hop of a collective costs this host in Python (frame, write, loopback, read, parse, wake), per rank
# process sharing a core. Measured on the 2-core dev box: llama3-70b TP4 ring per layer (960 hops a step a
# rank) at dilation 100 (a modelled hop of 501 µs) came within 4.4 % of the model; 4 ranks on 2 cores is 2 a
# core, so 250 µs a hop per rank a core.
HOST_HOP_S = 250e-6
# Rank processes this 2-core box carries beside a run's own, a core: a group of 8 (+ the switch) stepped within 2.6 %
# of the model (benchmarks/RESULTS.md, "Collectives"). The ring attention ranks and `kvtransit up`'s TP groups too.
PROCESSES_PER_CORE = 4
