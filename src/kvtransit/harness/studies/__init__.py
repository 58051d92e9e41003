"""Studies made of many runs: sweeps, the candidate table, chaos."""
