"""The testbed's processes, one package or module each: prefill, middlebox, decode, loadgen, kvpool.

Each is started by its `kvtransit <role>` subcommand and knows only its peers' addresses; what starts, places,
supervises and judges them is the harness, `kvtransit.emulator`, which no agent imports.
"""
