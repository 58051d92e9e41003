"""kvtransit: a hardware-in-the-loop emulator of compute in transit for LLM KV-cache hand-offs.

Layers (imports point one way; tests/unit/test_import_direction.py keeps it so):

    cli → agents → runtime → {kernels → model, wire}
    shaping stands alone (stdlib only); anyone above `model` may use it.
"""

__version__ = "0.1.0"
