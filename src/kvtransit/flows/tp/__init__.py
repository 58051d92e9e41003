"""Tensor- and expert-parallel groups: all-reduces and all-to-alls as real bytes between rank processes, in a ring or
through a switch that sums."""
