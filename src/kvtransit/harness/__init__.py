"""The harness: what starts, places, supervises, judges and sweeps the agent processes.

`launcher` (`kvtransit up`) starts the agents and supervises them (`supervisor`), `placement` puts them in
network namespaces behind a real tc link or on loopback, `chaos` runs faults against a live run and judges
it by its ledger, `sweep_runner` runs a grid of live runs and `sweep_report` draws its tables and plots.
Nothing in `kvtransit.agents` imports this package: an agent is a process that knows only its peers.
"""
