"""The switch that sums in the network (docs/reference.md §7, NVLink SHARP's place): every rank of a TP group sends its
part up, the switch adds the n streams (kernels/stream_sum.py) and sends the sum back down."""
