"""Where a run's requests come from: the drawn workload (model/serving/workload.py), a trace file replayed
(trace_file.py opens it: the one place a trace is read from disk), or a flow's own (a prefix workload); and what the
report says of them."""
