"""The testbed's processes, one package each: prefill, middlebox, decode, loadgen, kvpool
(and `common/`, what several of them share).

Each is started by its `kvtransit <role>` subcommand and knows only its peers' addresses; what starts, places,
supervises and judges them is the harness, `kvtransit.harness`, which no agent imports.
"""
