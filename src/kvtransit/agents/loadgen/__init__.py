"""The load generator process (`kvtransit loadgen`), the client that measures every figure.

`agent.py` sends the workload (`workload_source.py`: drawn or a trace) open-loop and records what comes
back; `ledger_writer.py` appends every request, token batch and outcome to the run's ledger; `report.py`
joins the client's records with each peer's /stats into the run report (`kv_pool_report.py`: its KV-tier
block). The report is the load generator's because the figures in it are the ones measured at the client.
"""
